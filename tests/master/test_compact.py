"""The compact object store: key index, object table, group LRU, and batched calls that
behave exactly like the same calls one key at a time."""

from __future__ import annotations

import contextlib
import gc
import random
import tracemalloc
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.errors import KVStoreError
from kvstore.master import batch, keyindex, wire
from kvstore.master.config import MasterConfig
from kvstore.master.keyindex import KeyIndex
from kvstore.master.metadata import MasterState
from kvstore.master.model import Endpoint, PutItem
from kvstore.types import ObjectKey, Tier

# ---- key index --------------------------------------------------------------------


def _churn(ki: KeyIndex, rng: random.Random, steps: int) -> dict[str, int]:
    """Random inserts and deletes on `ki`, checked against a dict after every batch."""
    live: dict[str, int] = {}
    next_id = 0
    for step in range(steps):
        keys = list({f"k{rng.randint(0, 3000)}" + "x" * rng.randint(0, 30) for _ in range(50)})
        found = ki.find_many(keys)
        assert found.tolist() == [live.get(k, -1) for k in keys]
        new = [k for k, f in zip(keys, found.tolist(), strict=True) if f < 0]
        ids = np.arange(next_id, next_id + len(new))
        next_id += len(new)
        ki.reserve_ids(next_id)
        ki.insert_many(ids, new)
        live.update(zip(new, ids.tolist(), strict=True))
        for key in rng.sample(sorted(live), min(len(live), rng.randint(0, 40))):
            ki.delete(live.pop(key))
        if step % 20 == 0:
            ki.check_integrity(np.array(sorted(live.values()), np.int64))
    ki.check_integrity(np.array(sorted(live.values()), np.int64))
    return live


def test_key_index_matches_a_dict_under_churn() -> None:
    ki = KeyIndex()
    live = _churn(ki, random.Random(7), 200)
    for key, i in live.items():
        assert ki.find(key) == i and ki.key_of(i) == key
    assert ki.find("absent") == -1 and ki.find_many(["absent"]).tolist() == [-1]


def test_key_index_survives_hash_collisions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key hashes alike: probes compare the bytes, never confuse two keys."""
    monkeypatch.setattr(keyindex, "_hash", lambda key: len(key) % 3)
    ki = KeyIndex()
    live = _churn(ki, random.Random(3), 40)
    assert all(ki.find(k) == i for k, i in live.items())


def test_key_index_rebuild_wraps_past_the_last_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys whose home is the table's last slots: a rebuild's sorted placement runs past
    the end and the rest probe on from slot 0; every key is still found."""
    monkeypatch.setattr(keyindex, "_hash", lambda key: -1 - len(key) % 4)
    ki = KeyIndex()
    live = _churn(ki, random.Random(5), 60)
    held = ki._table[ki._table >= 0]
    assert (ki._table[: min(len(held), 8)] >= 0).all(), "no key wrapped to slot 0"
    assert all(ki.find(k) == i for k, i in live.items())


def test_key_index_rebuild_places_as_probing_would() -> None:
    """A rebuild's sorted placement: each key at or after its home, no empty slot between."""
    ki = KeyIndex()
    n = 5000
    keys = [f"{i:032x}" for i in range(n)]
    ki.reserve_ids(n)
    ki.insert_many(np.arange(n), keys)  # past 768 keys: rebuilt more than once
    mask = ki._slots - 1
    for slot in np.nonzero(ki._table >= 0)[0].tolist():
        home = int(ki.hash[ki._table[slot]]) & mask
        walk = [(home + d) & mask for d in range(((slot - home) & mask) + 1)]
        assert all(ki._table[j] >= 0 for j in walk), f"a gap before slot {slot}"
    ki.check_integrity(np.arange(n))


def test_big_zeros_are_private_zeroed_mappings() -> None:
    """Arrays past HUGE_BYTES (private, huge-page-advised mappings) read as zeros, take
    writes, and a copy of one is its own memory."""
    n = keyindex.HUGE_BYTES // 8 + 3
    a = keyindex.zeros(n, np.int64)
    assert a.shape == (n,) and a.dtype == np.int64 and not a.any()
    a[::4096] = 7
    b = keyindex.zeros(n, np.int64)
    b[:] = a
    a[0] = 1
    assert int(a.sum()) == 7 * len(range(0, n, 4096)) - 6 and b[0] == 7 and not b[1:4096].any()


def test_key_index_arena_compacts_and_table_grows() -> None:
    ki = KeyIndex()
    n = 60_000
    keys = [f"{i:040x}" for i in range(n)]
    ki.reserve_ids(n)
    ki.insert_many(np.arange(n), keys)
    for i in range(0, n, 2):
        ki.delete(i)  # half the arena dead: compacted on the way
    assert ki._dead * 2 <= ki._end
    assert ki.find_many(keys[:10]).tolist() == [-1 if i % 2 == 0 else i for i in range(10)]
    ki.check_integrity(np.arange(1, n, 2))


# ---- batched calls == the same calls key by key -----------------------------------

KEYS = [f"t{i % 3}/k{i}" if i % 4 else f"k{i}" for i in range(24)]  # three tenants + none
OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"),
            st.lists(
                st.tuples(
                    st.sampled_from(KEYS), st.sampled_from([64, 64, 64, 200, 700]),
                    st.sampled_from([1, 1, 1, 2]), st.sampled_from(["", "", "g1", "g2", "k3"]),
                    st.sampled_from([None, None, Tier.DRAM, Tier.SSD]),
                    st.sampled_from(["", "", "a"]), st.sampled_from([0.0, 0.0, 5.0]),
                ),
                min_size=1, max_size=12,
            ),
        ),
        st.tuples(st.just("end"), st.lists(st.sampled_from(KEYS), max_size=12)),
        st.tuples(st.just("get"), st.lists(st.sampled_from(KEYS), max_size=12)),
        st.tuples(st.just("rm"), st.lists(st.sampled_from(KEYS), max_size=4)),
        st.tuples(st.just("clock"), st.floats(0.5, 8.0)),
    ),
    max_size=25,
)  # fmt: skip


def _pool(clock: list[float]) -> MasterState:
    cfg = MasterConfig(  # a quota turns per-tenant accounting on (the guard enforces it)
        high_watermark=1.0, low_watermark=1.0, default_lease_ttl_s=2.0, tenant_quota_bytes=1 << 40
    )
    st_ = MasterState(cfg, clock=lambda: clock[0])
    for node, dram in (("a", 4096), ("b", 2048), ("c", 2048)):
        st_.register_node(node, Endpoint())
        st_.mount_segment(node, f"{node}-dram", Tier.DRAM, dram)
    st_.mount_segment("a", "a-ssd", Tier.SSD, 4096)
    return st_


def _result(r: object) -> object:
    return type(r).__name__ if isinstance(r, KVStoreError) else r


def _snapshot(s: MasterState) -> object:
    objs = sorted(
        (k, o.size, o.group, int(o.state), o.replicas, o.lease_until, o.pin_until, o.writer)
        for k, o in s.objects.items()
    )
    segs = sorted((k, v.counters, v.used) for k, v in s.registry.segments.items())
    usage = s.objects.usage.metadata, s.objects.usage.tenant_bytes
    return objs, segs, list(s.groups.oldest_first()), s.counters, list(s.writing), usage


@pytest.mark.parametrize("path", ["numpy", "scalar"])
@settings(max_examples=100, deadline=None)
@given(ops=OPS)
def test_batched_calls_equal_key_by_key_calls(path: str, ops: list[tuple[str, object]]) -> None:
    """`path`: batches take the numpy path (threshold 0) or the key-by-key one."""
    _compare(ops, 0 if path == "numpy" else batch.SMALL)


@contextlib.contextmanager
def _threshold(small: int) -> Iterator[None]:
    """Batched calls made inside take the numpy path above `small` keys."""
    saved = batch.SMALL, wire.SMALL_BATCH
    batch.SMALL = wire.SMALL_BATCH = small
    try:
        yield
    finally:
        batch.SMALL, wire.SMALL_BATCH = saved


def _compare(ops: list[tuple[str, object]], small: int) -> None:
    """Each op on one pool as one batch and on another key by key: same everything.
    The batched pool's calls take the numpy path above `small` keys."""
    clocks = [[100.0], [100.0]]
    batched, single = _pool(clocks[0]), _pool(clocks[1])
    for op, arg in ops:
        if op == "clock":
            clocks[0][0] += arg  # type: ignore[operator]
            clocks[1][0] += arg  # type: ignore[operator]
            continue
        if op == "put":
            items = [
                PutItem(ObjectKey(k), size, reps, pref, group, tier, pin)
                for k, size, reps, group, tier, pref, pin in arg  # type: ignore[attr-defined]
            ]
            want = [single.put_start("w", "b", [it])[0] for it in items]
            with _threshold(small):
                got = batched.put_start("w", "b", items)
        elif op == "end":
            want = [single.put_end("w", [k])[0] for k in arg]  # type: ignore[attr-defined]
            with _threshold(small):
                got = batched.put_end("w", list(arg))  # type: ignore[arg-type]
        elif op == "get":
            want = [_result(single.lookup([k])[0][0]) for k in arg]  # type: ignore[attr-defined]
            with _threshold(small):
                got = batched.lookup(list(arg))[0]  # type: ignore[arg-type]
            want = [w if isinstance(w, str) else w.replicas for w in want]  # type: ignore[attr-defined]
            got = [_result(g) if isinstance(g, KVStoreError) else g.replicas for g in got]
        else:
            want = single.remove(list(arg))  # type: ignore[arg-type]
            got = batched.remove(list(arg))  # type: ignore[arg-type]
        assert [_result(g) for g in got] == [_result(w) for w in want], op
        assert _snapshot(batched) == _snapshot(single), op
        batched.check_integrity()


# ---- footprint: nothing Python per committed object -------------------------------


def test_committed_objects_cost_no_python_objects() -> None:
    """20k committed objects: a few hundred allocations in all (arrays grow), well under
    250 bytes each of traced memory, and no new GC-tracked container per object."""
    st_ = MasterState(MasterConfig())
    st_.register_node("n", Endpoint())
    st_.mount_segment("n", "s", Tier.DRAM, 1 << 40)
    n, batch = 20_000, 1000
    keys = [f"{i:032x}" for i in range(n)]
    gc.collect()
    containers = len(gc.get_objects())
    tracemalloc.start()
    base = tracemalloc.take_snapshot()
    for i in range(0, n, batch):
        part = keys[i : i + batch]
        res = st_.put_start("c", "", [PutItem(ObjectKey(k), 4096) for k in part])
        assert all(isinstance(r, list) for r in res)
        assert st_.put_end("c", part) == [None] * batch
    del part, res
    gc.collect()
    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    diff = snap.compare_to(base, "filename")
    size = sum(d.size_diff for d in diff)
    blocks = sum(d.count_diff for d in diff)
    assert size / n < 250, f"{size / n:.0f} bytes per object"
    assert blocks < n / 20, f"{blocks} allocations for {n} objects"
    assert len(gc.get_objects()) - containers < n / 20
    st_.check_integrity()
