"""Lookups over a whole batch (see kvstore.master.batch): leases, pins, counters, LRU
touches and promotion checks as `_lookup_one` per key in order would."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kvstore.errors import KVStoreError, NotFoundError, NotReadyError
from kvstore.master import batch
from kvstore.master.batch import COMPLETE, RowBatch
from kvstore.master.commit import count_bytes
from kvstore.master.objects import MAX_HITS

if TYPE_CHECKING:
    from kvstore.master.metadata import MasterState

_I64 = np.int64
MAX_REPORTED = 1 << 16  # cached reads of one key counted from one report at most

# ---- lookups ----------------------------------------------------------------------


def lookup(
    state: MasterState, keys: Sequence[str], ttl: float, pin: float, reader: str | None = None
) -> RowBatch:
    """COMPLETE rows of `keys`, leased and pinned, as `_lookup_one` per key would;
    `reader` (not None) is recorded as the leases' holder (ObjectTable.record_readers)."""
    now = state.clock()
    t = state.objects
    res = peek(state, keys)
    if reader is not None:
        t.record_readers(res.ids[res.ids >= 0], reader, now)
    if len(keys) <= batch.SMALL:
        _lookup_few(state, res, now, ttl, pin)
        return res
    hit = np.nonzero(res.ids >= 0)[0]
    state.counters.misses += len(keys) - len(hit)
    state.counters.hits += len(hit)
    if not len(hit):
        return res
    rows = res.ids[hit]
    counts = np.bincount(t.col["seg"][rows])
    for slot in np.nonzero(counts)[0].tolist():  # the first replica's segment serves it
        t.segments[slot].counters.hits += int(counts[slot])
    count_bytes(state, rows, "bytes_out", first_only=True)
    hits = t.col["hits"]  # (a key twice in one batch counts once)
    hits[rows] = np.minimum(hits[rows], MAX_HITS - 1) + 1
    lease = t.col["lease"]
    lease[rows] = np.maximum(lease[rows], now + ttl)
    if pin > 0:
        pins = t.col["pin"]
        pins[rows] = np.maximum(pins[rows], now + pin)
    state.groups.touch_ids(rows)
    slow = state.tiering.slow_slots()
    if slow is not None:
        for i in rows[slow[t.col["seg"][rows]]].tolist():
            state.tiering.on_hit(t.view(i))
    return res


def _lookup_few(state: MasterState, res: RowBatch, now: float, ttl: float, pin: float) -> None:
    """The side effects of `lookup` key by key (small batches)."""
    t = state.objects
    state.counters.misses += len(res.errors)
    slow = state.tiering.slow_slots()
    for i in res.ids.tolist():
        if i < 0:
            continue
        t.lease_v[i] = max(t.lease_v[i], now + ttl)
        if pin > 0:
            t.pin_v[i] = max(t.pin_v[i], now + pin)
        _count_hits(state, i, 1, slow)


def _count_hits(state: MasterState, i: int, n: int, slow: np.ndarray | None) -> None:
    """`n` hits of row `i` (a lookup's, or reads a client served from its cache): hit
    and byte counters of the pool and of the segment that serves it, the row's hit
    count, the LRU, and promotion from a slow tier (`slow`: Tiering.slow_slots)."""
    t = state.objects
    state.counters.hits += n
    extra = t.extra.get(i)
    seg = t.segments[t.seg_v[i]] if extra is None else state.registry.segments[
        (extra[0].node_id, extra[0].segment)]  # fmt: skip
    seg.counters.hits += n
    seg.counters.bytes_out += n * int(t.size_v[i])
    t.hits_v[i] = min(int(t.hits_v[i]) + n, MAX_HITS)
    g = t.group_v[i]
    state.groups.touch_node(~g if g >= 0 else i)
    if slow is not None and slow[t.seg_v[i]]:
        state.tiering.on_hit(t.view(i), n)


def count_cached(
    state: MasterState, keys: Sequence[str], reads: Sequence[int], client_id: str = ""
) -> int:
    """`reads[j]` reads of `keys[j]` that a client served from an SSD location it had
    cached (kvstore.client.locations), reported with its next lookup: counted as that
    many lookup hits are (hit and byte counters, LRU touch, promotion), with no lease or
    pin. Only objects still under a read lease, or under `client_id`'s own writer lease
    (it cached the location its put wrote), count: a cached read happens inside the
    lease that let it cache, so a report for an object nobody holds is late (its lease
    ended) or bogus. The reads counted."""
    now = state.clock()
    t = state.objects
    res = peek(state, keys)
    slow = state.tiering.slow_slots()
    writers = state.writer_leases
    counted = 0
    for j, i in enumerate(res.ids.tolist()):
        n = min(int(reads[j]), MAX_REPORTED)
        if i < 0 or n <= 0:
            continue
        if t.lease_v[i] <= now and not (client_id and writers.holder(keys[j], now) == client_id):
            continue
        _count_hits(state, i, n, slow)
        counted += n
    return counted


def peek(state: MasterState, keys: Sequence[str]) -> RowBatch:
    """COMPLETE rows of `keys` with no side effect."""
    t = state.objects
    if len(keys) <= batch.SMALL:
        ids = np.array([t.index.find(k) for k in keys], _I64)
    else:
        ids = t.index.find_many(keys)
    errors: dict[int, KVStoreError] = {}
    states = t.col["state"][np.maximum(ids, 0)]
    for j in np.nonzero((ids < 0) | (states != COMPLETE))[0].tolist():
        if ids[j] < 0:
            errors[j] = NotFoundError(f"unknown key {keys[j]!r}")
        else:
            errors[j] = NotReadyError(f"{keys[j]!r} is still being written")
            ids[j] = -1
    return RowBatch(ids, errors)
