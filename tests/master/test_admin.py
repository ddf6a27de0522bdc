"""kvstore.master.admin on a MasterState with a fake clock: evict, pin, inspect, cordon,
and a reader's own lease not blocking its own remove."""

from __future__ import annotations

import pytest

from kvstore.errors import BadRequestError, NotFoundError, NotReadyError
from kvstore.master import admin
from kvstore.master.metadata import MasterState
from kvstore.master.model import PutItem
from kvstore.types import ObjectKey, Tier

from .conftest import FakeClock, make_state, two_nodes


def _put(st: MasterState, key: str, size: int = 256, tier: Tier | None = None, **kw: str) -> None:
    locs = st.put_start("w", "", [PutItem(ObjectKey(key), size, tier=tier, **kw)])[0]
    assert isinstance(locs, list), locs
    assert st.put_end("w", [key]) == [None]


def test_evict_keys_and_prefix_skip_protected_unless_forced(state: MasterState) -> None:
    for k in ("chat/1", "chat/2", "other"):
        _put(state, k)
    state.lookup(["chat/2"])  # leased now
    res = admin.evict(state, admin.EvictSpec(prefix="chat/"))
    assert (res.evicted, res.skipped, res.keys) == (1, 1, ["chat/1"])
    assert set(state.objects) == {"chat/2", "other"}
    dry = admin.evict(state, admin.EvictSpec(keys=("chat/2", "nope"), force=True, dry_run=True))
    assert (dry.evicted, dry.missing, "chat/2" in state.objects) == (1, 1, True)
    forced = admin.evict(state, admin.EvictSpec(keys=("chat/2",), force=True))
    assert forced.evicted == 1 and set(state.objects) == {"other"}
    state.check_integrity()


def test_evict_tier_to_watermark_takes_lru_groups_whole(
    state: MasterState, clock: FakeClock
) -> None:
    # DRAM: a 4096 + b 2048 = 6144 bytes; 5 x 1024 in DRAM = 5120 used.
    for i in range(5):
        _put(state, f"k{i}", 1024, Tier.DRAM)
        clock.advance(1)
    state.lookup(["k0"])  # k0 is now the most recently used (and leased)
    clock.advance(10)  # leases expired
    res = admin.evict(state, admin.EvictSpec(tier=Tier.DRAM, watermark=0.5))
    # 5120 -> at most 3072: the two least recently used go (k1, k2).
    assert res.keys == ["k1", "k2"] and res.freed_bytes == 2048
    assert admin.tier_usage(state, Tier.DRAM) == (3072, 6144)
    state.check_integrity()


def test_evict_spec_is_validated() -> None:
    with pytest.raises(BadRequestError, match="exactly one"):
        admin.EvictSpec()
    with pytest.raises(BadRequestError, match="exactly one"):
        admin.EvictSpec(keys=("a",), prefix="p")
    with pytest.raises(BadRequestError, match="watermark"):
        admin.EvictSpec(tier=Tier.DRAM, watermark=1.5)
    with pytest.raises(BadRequestError, match="never forces"):
        admin.EvictSpec(tier=Tier.DRAM, force=True)


def test_pin_blocks_eviction_until_unpinned(state: MasterState, clock: FakeClock) -> None:
    _put(state, "k")
    results, ttl = admin.pin(state, ["k", "nope"], 60.0)
    assert results[0] is None and isinstance(results[1], NotFoundError) and ttl == 60.0
    clock.advance(30)
    assert admin.evict(state, admin.EvictSpec(keys=("k",))).skipped == 1
    assert admin.unpin(state, ["k"]) == [None]
    assert admin.evict(state, admin.EvictSpec(keys=("k",))).evicted == 1


def test_inspect_reports_group_age_and_sole_lease_holder(
    state: MasterState, clock: FakeClock
) -> None:
    _put(state, "k", group="g")
    _put(state, "k2", group="g")
    clock.advance(2)
    book = admin.ReaderBook()
    book.record("k", "reader-1", clock(), clock() + 5)
    found = admin.inspect(state, "k", book)
    assert (found.group_members, found.age_s, found.lease_holder) == (2, 2.0, "reader-1")
    book.record("k", "reader-2", clock(), clock() + 5)
    assert admin.inspect(state, "k", book).lease_holder == ""
    with pytest.raises(NotFoundError):
        admin.inspect(state, "absent")


def test_own_lease_does_not_block_own_remove(state: MasterState, clock: FakeClock) -> None:
    _put(state, "k")
    book = admin.ReaderBook()
    _, ttl = state.lookup(["k"])
    book.record("k", "me", clock(), clock() + ttl)
    assert admin.removable_by_reader(state, book, ["k"], "me") == {"k"}
    assert admin.removable_by_reader(state, book, ["k"], "you") == set()
    book.record("k", "", clock(), clock() + ttl)  # an anonymous reader joins
    assert admin.removable_by_reader(state, book, ["k"], "me") == set()
    assert isinstance(state.remove(["k"])[0], NotReadyError)


def test_own_lease_with_a_pin_still_blocks(state: MasterState, clock: FakeClock) -> None:
    _put(state, "k")
    book = admin.ReaderBook()
    _, ttl = state.lookup(["k"], pin_ttl_s=30)
    book.record("k", "me", clock(), clock() + ttl)
    assert admin.removable_by_reader(state, book, ["k"], "me") == set()


def test_reader_book_prunes_expired(clock: FakeClock) -> None:
    book = admin.ReaderBook()
    book.record("a", "me", clock(), clock() + 1)
    book.record("b", "me", clock(), clock() + 10)
    clock.advance(5)
    assert book.prune(clock()) == 1 and len(book) == 1


def test_cordon_keeps_new_replicas_off_the_node(state: MasterState) -> None:
    assert admin.cordon(state, "a", True) == ["a"]
    for i in range(3):
        _put(state, f"k{i}", 256)
    assert {r.node_id for o in state.objects.values() for r in o.replicas} == {"b"}
    assert admin.cordon(state, "a", False) == []
    with pytest.raises(NotFoundError):
        admin.cordon(state, "nobody", True)
    state.check_integrity()


def test_reader_book_record_many_equals_record() -> None:
    import random

    from kvstore.master.admin import ReaderBook

    rng = random.Random(5)
    one, many = ReaderBook(), ReaderBook()
    now = 0.0
    for _ in range(300):
        now += rng.random()
        keys = [f"k{rng.randint(0, 9)}" for _ in range(rng.randint(0, 6))]
        reader = rng.choice(["", "r1", "r2"])
        until = now + rng.choice([0.5, 2.0, 5.0])
        for key in keys:
            one.record(key, reader, now, until)
        many.record_many(keys, reader, now, until)
        assert one._by_key == many._by_key


def test_reader_column_equals_the_reader_book(clock) -> None:  # type: ignore[no-untyped-def]
    """Lookups that record their reader in the object table answer `holder` and
    `only_reader` as a ReaderBook fed the same leases does."""
    import random

    from kvstore.master.admin import ReaderBook

    rng = random.Random(11)
    st = two_nodes(make_state(clock))
    keys = [f"k{i}" for i in range(12)]
    st.put_start("w", "a", [PutItem(ObjectKey(k), 64) for k in keys])
    st.put_end("w", keys)
    table_book, dict_book = ReaderBook(st.objects), ReaderBook()
    for _ in range(300):
        clock.advance(rng.random() * 2)
        batch = [rng.choice(keys) for _ in range(rng.choice([1, 3, 40]))]
        reader = rng.choice(["", "r1", "r2"])
        _, ttl = st.lookup_rows(batch, rng.choice([0.5, 2.0, 5.0]), 0.0, reader)
        dict_book.record_many(batch, reader, clock.now, clock.now + ttl)
        for key in keys:
            assert table_book.holder(key, clock.now) == dict_book.holder(key, clock.now), key
            obj = st.objects[key]
            for who in ("r1", "r2"):
                if obj.protected(clock.now):
                    assert table_book.only_reader(obj, who, clock.now) == dict_book.only_reader(
                        obj, who, clock.now
                    )


def test_remove_on_one_node_keeps_the_other_replicas(state: MasterState, clock: FakeClock) -> None:
    """Mooncake's per-segment replica clear: Remove(node_id) drops only that node's
    replicas and frees their space; the object goes with its last replica."""
    _put(state, "k", 512, replicas=2)  # type: ignore[arg-type]
    assert {r.node_id for r in state.objects["k"].replicas} == {"a", "b"}
    used = {k: s.used for k, s in state.registry.segments.items()}
    missing = state.remove(["k"], node_id="c")[0]
    assert isinstance(missing, NotFoundError) and "no replica on node 'c'" in str(missing)
    state.lookup(["k"])  # leased: refused as a whole remove would be
    assert isinstance(state.remove(["k"], node_id="a")[0], NotReadyError)
    clock.advance(10)
    assert state.remove(["k"], node_id="a") == [None]
    assert [r.node_id for r in state.objects["k"].replicas] == ["b"]
    assert state.registry.segment("a", "a-dram").used == used[("a", "a-dram")] - 512
    state.check_integrity()
    assert isinstance(state.remove(["k"], node_id="a")[0], NotFoundError)
    assert state.remove(["k"], node_id="b") == [None] and "k" not in state.objects
    state.check_integrity()
