"""MasterState: placement, two-phase put, leases, pins, eviction, reclaim, node death."""

from __future__ import annotations

import pytest

from kvstore.errors import BadRequestError, ExistsError, NoSpaceError, NotFoundError, NotReadyError
from kvstore.master.metadata import MasterState
from kvstore.master.model import ObjectMeta, PutItem
from kvstore.types import Location, ObjectKey, Tier

from .conftest import FakeClock, make_state, two_nodes


def item(key: str, size: int = 64, **kw: object) -> PutItem:
    return PutItem(ObjectKey(key), size, **kw)  # type: ignore[arg-type]


def put(st: MasterState, *items: PutItem, client: str = "w", node: str = "") -> list[object]:
    res = st.put_start(client, node, list(items))
    ok = [it.key for it, r in zip(items, res, strict=True) if isinstance(r, list)]
    assert st.put_end(client, ok) == [None] * len(ok)
    st.check_integrity()
    return res


def test_placement_local_first_then_most_free(state: MasterState) -> None:
    [locs] = state.put_start("w", "b", [item("k1", 100)])
    assert locs == [Location("b", Tier.DRAM, "b-dram", 0, 100)]
    [locs] = state.put_start("w", "", [item("k2", 100)])  # no local node: fastest tier, most free
    assert locs == [Location("a", Tier.DRAM, "a-dram", 0, 100)]
    [locs] = state.put_start("w", "b", [item("k3", 64, preferred_node="a", tier=Tier.SSD)])
    assert locs == [Location("a", Tier.SSD, "a-ssd", 0, 64)]
    state.check_integrity()


def test_replicas_on_distinct_nodes_or_no_space(state: MasterState) -> None:
    [locs] = state.put_start("w", "a", [item("k", 128, replicas=2)])
    assert isinstance(locs, list)
    assert [(loc.node_id, loc.segment) for loc in locs] == [("a", "a-dram"), ("b", "b-dram")]
    [err] = state.put_start("w", "a", [item("k3", 64, replicas=3)])
    assert isinstance(err, NoSpaceError)
    assert state.registry.used() == 2 * 128  # the failed put kept nothing
    state.check_integrity()


def test_two_phase_visibility_and_one_winner(state: MasterState) -> None:
    [locs] = state.put_start("w1", "a", [item("k")])
    [dup] = state.put_start("w2", "b", [item("k")])
    assert isinstance(dup, ExistsError)
    found, _ = state.lookup(["k"])
    assert isinstance(found[0], NotReadyError)
    assert isinstance(state.put_end("w2", ["k"])[0], ExistsError)
    assert state.put_end("w1", ["k", "k", "nope"])[:2] == [None, None]
    found, ttl = state.lookup(["k"])
    assert isinstance(found[0], ObjectMeta) and found[0].replicas == locs and ttl == 5
    [again] = state.put_start("w2", "b", [item("k")])
    assert isinstance(again, ExistsError)
    state.check_integrity()


def test_batch_reports_per_key_errors(state: MasterState) -> None:
    res = state.put_start("w", "a", [item("x", 64), item("big", 1 << 20), item("y", 64)])
    assert isinstance(res[0], list) and isinstance(res[1], NoSpaceError)
    assert isinstance(res[2], list)
    res2 = state.put_end("w", ["x", "big", "y"])
    assert res2[0] is None and isinstance(res2[1], NotFoundError) and res2[2] is None
    with pytest.raises(BadRequestError):
        item("bad", 0)


def test_revoke_frees_space(state: MasterState) -> None:
    state.put_start("w", "a", [item("k", 1000)])
    assert isinstance(state.put_revoke("other", ["k"])[0], ExistsError)
    assert state.put_revoke("w", ["k"]) == [None]
    assert state.registry.used() == 0 and "k" not in state.objects
    put(state, item("c"))
    assert isinstance(state.put_revoke("w", ["c"])[0], NotReadyError)
    state.check_integrity()


def test_lease_blocks_eviction_until_expiry(state: MasterState, clock: FakeClock) -> None:
    # b-dram holds 2048: fill it with 4 groups of 512 from node b's writer, tier DRAM.
    for i in range(3):
        put(state, item(f"g{i}", 512, preferred_node="b"))
    state.lookup(["g0"], lease_ttl_s=2)  # g0 leased; g1 is now least recently used
    clock.advance(1)
    [locs] = state.put_start("w", "", [item("new", 1024, preferred_node="b", tier=Tier.DRAM)])
    # needs 1024 on b? b has 512 free -> placement falls to node a (most free DRAM)
    assert isinstance(locs, list) and locs[0].node_id == "a"
    assert isinstance(state.remove(["g0"])[0], NotReadyError)
    clock.advance(1.5)  # lease over
    assert state.remove(["g0"]) == [None]
    state.check_integrity()


def test_eviction_order_respects_lease_pin_and_writes(state: MasterState, clock: FakeClock) -> None:
    opts = {"tier": Tier.DRAM, "preferred_node": "b"}
    put(state, item("pinned", 512, pin_ttl_s=100, **opts))
    put(state, item("old", 512, **opts))
    put(state, item("leased", 512, **opts))
    state.put_start("w", "b", [item("writing", 448, **opts)])  # in flight
    state.lookup(["leased", "old"])  # lease both; "old" becomes most recent
    clock.advance(6)  # leases expire; the pin (100 s) does not
    # b-dram is full (2048 - 64 free); a 1024 put restricted to b's DRAM must evict.
    state.unmount_segment("a", "a-dram")
    state.unmount_segment("a", "a-ssd")
    [locs] = state.put_start("w", "b", [item("new", 1024, **opts)])
    assert locs == [Location("b", Tier.DRAM, "b-dram", 512, 1024)]
    assert sorted(state.objects) == ["new", "pinned", "writing"]  # leased, then old, evicted
    assert state.counters.evictions == 2
    state.check_integrity()


def test_group_evicted_together(state: MasterState) -> None:
    opts = {"tier": Tier.DRAM, "preferred_node": "b"}
    put(state, *(item(f"blk1/L{i}", 256, group="blk1", **opts) for i in range(4)))
    put(state, *(item(f"blk2/L{i}", 256, group="blk2", **opts) for i in range(4)))
    state.lookup(["blk1/L0"])  # blk1 recently used (and leased: expires below)
    state.clock.advance(10)  # type: ignore[attr-defined]
    state.unmount_segment("a", "a-dram")
    state.unmount_segment("a", "a-ssd")
    [locs] = state.put_start("w", "b", [item("solo", 256, **opts)])
    assert isinstance(locs, list)
    assert sorted(state.objects) == [f"blk1/L{i}" for i in range(4)] + ["solo"]
    state.check_integrity()


def test_watermark_eviction_down_to_low(clock: FakeClock) -> None:
    # Without offload each tier evicts on its own: DRAM = 4096 + 2048, high 0.9, low 0.5.
    state = two_nodes(make_state(clock, offload=False))
    for i in range(13):
        put(state, item(f"k{i:02d}", 1024, tier=Tier.DRAM))
        dram = [s for s in state.registry.live_segments() if s.tier == Tier.DRAM]
        assert sum(s.used for s in dram) <= 0.9 * 6144
    # k09's put pushed DRAM to 6144 > 0.9 * 6144: eviction ran down to 3072 bytes while
    # k09 was still being written (not evictable): k06-k08 went; k09-k12 remain.
    assert sorted(state.objects) == [f"k{i:02d}" for i in range(9, 13)]
    assert state.counters.evictions == 9
    state.check_integrity()


def test_pin_ttl(state: MasterState, clock: FakeClock) -> None:
    put(state, item("p", pin_ttl_s=10))
    assert isinstance(state.remove(["p"])[0], NotReadyError)
    clock.advance(10.5)
    assert state.remove(["p"]) == [None]
    put(state, item("q"))
    state.lookup(["q"], pin_ttl_s=20)
    clock.advance(19)
    assert isinstance(state.remove(["q"])[0], NotReadyError)
    assert state.remove(["q"], force=True) == [None]


def test_writer_death_reclaim(state: MasterState, clock: FakeClock) -> None:
    state.put_start("dead", "a", [item("k1", 512)])
    clock.advance(20)
    state.put_start("live", "a", [item("k2", 512)])
    clock.advance(11)  # k1 is 31 s old, k2 11 s
    assert state.reclaim_stale_puts() == 1
    assert sorted(state.objects) == ["k2"] and state.registry.used() == 512
    clock.advance(20)
    [locs] = state.put_start("new", "a", [item("k2", 64)])  # stale k2 reclaimed inline
    assert isinstance(locs, list) and state.counters.reclaimed_puts == 2
    assert isinstance(state.put_end("live", ["k2"])[0], ExistsError)
    state.check_integrity()


def test_node_death_drops_replicas(state: MasterState, clock: FakeClock) -> None:
    put(state, item("both", 64, replicas=2), node="a")
    put(state, item("only-b", 64), node="b")
    state.put_start("w", "b", [item("writing-b", 64)])
    clock.advance(5)
    state.heartbeat("a")
    clock.advance(6)  # b silent 11 s > 10
    dead, _, _ = state.tick()
    assert dead == ["b"]
    assert sorted(state.objects) == ["both"]
    assert [r.node_id for r in state.objects["both"].replicas] == ["a"]
    with pytest.raises(NotFoundError):
        state.heartbeat("b")
    assert state.counters.dropped_replicas == 3
    state.check_integrity()


def test_mount_errors(state: MasterState) -> None:
    with pytest.raises(NotFoundError):
        state.mount_segment("zz", "s", Tier.DRAM, 4096)
    with pytest.raises(BadRequestError):
        state.mount_segment("a", "tiny", Tier.DRAM, 10)
    state.mount_segment("a", "a-dram", Tier.DRAM, 4096)  # same geometry: idempotent
    with pytest.raises(ExistsError):
        state.mount_segment("a", "a-dram", Tier.DRAM, 8192)
    with pytest.raises(NotFoundError):
        state.unmount_segment("a", "nope")


def test_hopeless_put_evicts_nothing(state: MasterState) -> None:
    put(state, item("a1", 512, tier=Tier.SSD))
    put(state, item("d1", 512, tier=Tier.DRAM, preferred_node="a"))
    for size, kw in [(1 << 20, {}), (64, {"replicas": 3}), (8192, {"tier": Tier.DRAM})]:
        [err] = state.put_start("w", "", [item("huge", size, **kw)])
        assert isinstance(err, NoSpaceError)
    assert sorted(state.objects) == ["a1", "d1"] and state.counters.evictions == 0


def test_eviction_for_a_tier_spares_other_tiers(clock: FakeClock) -> None:
    # Watermarks at 1.0: only a put that finds no room evicts, within its own tier.
    state = two_nodes(make_state(clock, high_watermark=1.0, low_watermark=1.0))
    put(state, item("ssd-old", 4096, tier=Tier.SSD))
    for i in range(3):
        put(state, item(f"d{i}", 2048, tier=Tier.DRAM))  # a-dram 4096 + b-dram 2048: full
    [locs] = state.put_start("w", "", [item("new", 2048, tier=Tier.DRAM)])
    assert isinstance(locs, list) and locs[0].segment == "a-dram"
    assert sorted(state.objects) == ["d1", "d2", "new", "ssd-old"]  # only d0 (LRU DRAM) went
    state.check_integrity()
