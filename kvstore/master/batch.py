"""The master's batched hot paths: PutStart, PutEnd and lookups over whole batches.

Each does what calling `MasterState`'s per-key steps in order would do (same
results, errors, placements, counters and LRU order) but reads and writes the
object table's columns for all keys at once. Anything unusual in a batch (a key
twice, a stale write to reclaim, a put that must evict to fit, several replicas)
falls back to the per-key step for that key, in its place in the order.

PutEnd is in kvstore.master.commit, lookups in kvstore.master.lookups; this
module holds the batch types and PutStart. The service calls these with columns
it read off the request (`PutColumns`), and encodes replies from row ids
(kvstore.master.wire): no PutItem, Location or ObjectMeta is built per key on
the common path.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from kvstore.errors import ExistsError, KVStoreError
from kvstore.master import leases
from kvstore.master.model import ObjectState, PutItem
from kvstore.master.placement import place_run
from kvstore.types import MAX_KEY_BYTES, ObjectKey, Tier

if TYPE_CHECKING:
    from kvstore.master.metadata import MasterState

_I64 = np.int64
WRITING, COMPLETE = int(ObjectState.WRITING), int(ObjectState.COMPLETE)
MAX_TIER = int(max(Tier))
SMALL = 16  # batches up to this many keys run key by key: numpy's fixed cost would dominate


@dataclass(slots=True)
class PutColumns:
    """A PutStart batch as columns; `errors`: items already refused (by index)."""

    keys: list[str]
    sizes: list[int]
    replicas: list[int]
    preferred: list[str]
    groups: list[str]
    tiers: list[int]  # -1 = any tier
    pin_ttls: list[float]
    errors: dict[int, KVStoreError] = field(default_factory=dict)

    @classmethod
    def from_items(cls, items: Sequence[PutItem]) -> PutColumns:
        return cls(
            [it.key for it in items], [it.size for it in items], [it.replicas for it in items],
            [it.preferred_node for it in items], [it.group for it in items],
            [-1 if it.tier is None else int(it.tier) for it in items],
            [it.pin_ttl_s for it in items],
        )  # fmt: skip

    def item(self, i: int) -> PutItem:
        tier = None if self.tiers[i] < 0 else Tier(self.tiers[i])
        return PutItem(
            ObjectKey(self.keys[i]), self.sizes[i], self.replicas[i], self.preferred[i],
            self.groups[i], tier, self.pin_ttls[i],
        )  # fmt: skip

    def suspects(self) -> list[int]:
        """Indices PutItem's checks might refuse (the caller checks those one by one):
        a bad size, replica count, pin, tier, or an empty or possibly too long key."""
        n = len(self.keys)
        if n <= SMALL:
            return [i for i in range(n) if _suspect(self, i)]
        sizes = np.fromiter(self.sizes, np.uint64, n)  # a uint64 field: int64 would overflow
        reps = np.fromiter(self.replicas, _I64, n)
        pins = np.fromiter(self.pin_ttls, np.float64, n)
        lens = np.fromiter(map(len, self.keys), _I64, n)
        tiers = np.fromiter(self.tiers, _I64, n)
        bad = (sizes == 0) | (sizes >= np.uint64(1 << 63)) | (reps < 1) | (reps > 16)
        bad |= ~(pins >= 0) | (lens == 0)
        bad |= (lens * 4 > MAX_KEY_BYTES) | (tiers > max(Tier)) | (tiers < -1)
        return np.nonzero(bad)[0].tolist()


# A PutStart request and its columns, as the master's guard read them to check it (kvstore.
# security.guard), so that the servicer reads the request's fields only once.
PREPARED: ContextVar[tuple[object, PutColumns] | None] = ContextVar("put_columns", default=None)


def _suspect(c: PutColumns, i: int) -> bool:
    return not (
        0 < c.sizes[i] < 1 << 63 and 1 <= c.replicas[i] <= 16 and c.pin_ttls[i] >= 0
        and len(c.keys[i]) > 0 and len(c.keys[i]) * 4 <= MAX_KEY_BYTES
        and -1 <= c.tiers[i] <= MAX_TIER
    )  # fmt: skip


@dataclass(slots=True)
class RowBatch:
    """Per key: its row id (-1 when the key has an error) and the errors by index."""

    ids: np.ndarray
    errors: dict[int, KVStoreError]


# ---- PutStart ---------------------------------------------------------------------


def put_start(state: MasterState, client_id: str, client_node: str, cols: PutColumns) -> RowBatch:
    """Reserve space for each new key, as `_put_one` per key in order would."""
    now = state.clock()
    n = len(cols.keys)
    ids = np.full(n, -1, _I64)
    errors = dict(cols.errors)
    todo = [i for i in range(n) if i not in errors]
    keys = [cols.keys[i] for i in todo]
    run = _PutRun(state, client_id, client_node, cols, now, ids, errors)
    if len(todo) <= SMALL or len(set(keys)) < len(keys) or _any_stale(state, keys, now):
        for i in todo:  # few keys, a key twice, or a stale write to reclaim: one by one
            run.alone(i)
        return RowBatch(ids, errors)
    found = state.objects.index.find_many(keys)
    existing = {i: f for i, f in zip(todo, found.tolist(), strict=True) if f >= 0}
    run.place(todo, existing)
    return RowBatch(ids, errors)


def _any_stale(state: MasterState, keys: list[str], now: float) -> bool:
    timeout = state.config.put_timeout_s
    writing = state.writing
    return bool(writing) and any(k in writing and now - writing[k] > timeout for k in keys)


def _exists(state: MasterState, i: int, key: str) -> KVStoreError:
    what = "being written" if state.objects.state_v[i] == WRITING else "committed"
    return ExistsError(f"key {key!r} is already {what}")


def _run_ends(c: PutColumns, todo: list[int], existing: dict[int, int]) -> list[int]:
    """For each position j of `todo`: where the run of items placed alike (same size,
    replicas, tier and preferred node; none existing) that j is in ends."""
    n = len(todo)
    if not n:
        return []
    cut = np.zeros(n + 1, bool)
    cut[0] = cut[n] = True
    for column in (c.sizes, c.replicas, c.tiers):  # `todo` only: a refused item's size
        vals = np.fromiter(map(column.__getitem__, todo), _I64, n)  # may not fit int64
        cut[1:n] |= vals[1:] != vals[:-1]
    pref = [c.preferred[i] for i in todo]
    if len(set(pref)) > 1:
        cut[1:n] |= np.array([a != b for a, b in zip(pref[1:], pref[:-1], strict=True)])
    if existing:
        hit = np.fromiter((i in existing for i in todo), bool, n)
        cut[:n] |= hit
        cut[1 : n + 1] |= hit
    starts = np.nonzero(cut)[0]
    return np.repeat(starts[1:], np.diff(starts)).tolist()


class _PutRun:
    """Places keys in order: runs of like single-replica items in one go, the rest one
    by one; rows are created in item order (`flush` before anything that may evict, so
    eviction sees every earlier key of the batch as WRITING)."""

    def __init__(
        self, state: MasterState, client_id: str, client_node: str, cols: PutColumns,
        now: float, ids: np.ndarray, errors: dict[int, KVStoreError],
    ) -> None:  # fmt: skip
        self.state, self.client_id, self.client_node = state, client_id, client_node
        self.cols, self.now, self.ids, self.errors = cols, now, ids, errors
        self.pending: list[int] = []  # placed items without rows yet
        self.slots: list[np.ndarray] = []
        self.offsets: list[np.ndarray] = []

    def place(self, todo: list[int], existing: dict[int, int]) -> None:
        """Items `todo` in order; `existing`: those whose key was there at the start
        (refused, unless an eviction on the way may have removed it: from then on
        every item is checked and placed alone)."""
        c, counters = self.cols, self.state.counters
        evictions = counters.evictions
        ends = _run_ends(c, todo, existing)
        j = 0
        while j < len(todo):
            i = todo[j]
            if counters.evictions != evictions:
                self.alone(i)
                j += 1
                continue
            if i in existing:
                self.errors[i] = _exists(self.state, existing[i], c.keys[i])
                j += 1
                continue
            run = todo[j : ends[j]]
            done = self._place_run(run) if c.replicas[i] == 1 else 0
            if done < len(run):  # the next item needs more than the best segment's room
                self.alone(run[done])
                done += 1
            j += done
        self.flush()

    def _place_run(self, run: list[int]) -> int:
        item = self.cols.item(run[0])
        segs = self.state.registry.live_segments()
        placed = 0
        for seg, off, n in place_run(segs, item, self.client_node, len(run)):
            step = seg.allocator.aligned(item.size)
            self.slots.append(np.full(n, seg.slot, _I64))
            self.offsets.append(off + step * np.arange(n, dtype=_I64))
            placed += n
        self.pending.extend(run[:placed])
        return placed

    def alone(self, i: int) -> None:
        """Item `i` through the per-key step (`MasterState._put_one`)."""
        self.flush()
        res = self.state._put_one(self.client_id, self.client_node, self.cols.item(i), self.now)
        if isinstance(res, KVStoreError):
            self.errors[i] = res
        else:
            self.ids[i] = self.state.objects.index.find(self.cols.keys[i])

    def flush(self) -> None:
        if not self.pending:
            return
        c, idx, st = self.cols, self.pending, self.state
        rows = st._new_objects(
            [c.keys[i] for i in idx], np.array([c.sizes[i] for i in idx], _I64),
            np.concatenate(self.slots), np.concatenate(self.offsets),
            [c.groups[i] for i in idx], ObjectState.WRITING,
            st.objects.writer_id(self.client_id), self.now,
        )  # fmt: skip
        for r, i in zip(rows.tolist(), idx, strict=True):
            if c.pin_ttls[i]:
                ttl = leases.pin_ttl(st.config, c.pin_ttls[i])
                if ttl > 0:
                    st.objects.pin_ttl[r] = ttl
        self.ids[idx] = rows
        self.pending, self.slots, self.offsets = [], [], []


__all__ = ["PutColumns", "RowBatch", "put_start"]
