"""PutEnd over a whole batch (see kvstore.master.batch): commit keys as `_end_one`
per key in order would, with the table's columns written for all keys at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kvstore.errors import BadRequestError, ExistsError, KVStoreError, NotFoundError
from kvstore.master import batch
from kvstore.master.batch import COMPLETE, WRITING

if TYPE_CHECKING:
    from kvstore.master.metadata import MasterState

_I64 = np.int64


# ---- PutEnd -----------------------------------------------------------------------


def put_end(
    state: MasterState, client_id: str, keys: Sequence[str], checksums: Sequence[int]
) -> tuple[list[KVStoreError | None], dict[int, list[int]]]:
    """Commit keys (see MasterState.put_end_durable), as `_end_one` per key would."""
    if checksums and len(checksums) != len(keys):
        raise BadRequestError(f"{len(checksums)} checksums for {len(keys)} keys")
    now = state.clock()
    t = state.objects
    n = len(keys)
    results: list[KVStoreError | None] = [None] * n
    if not n:
        return results, {}
    if n <= batch.SMALL:
        return _commit_few(state, client_id, keys, checksums, now, results)
    ids = t.index.find_many(keys)
    wid = t.writer_ids.get(client_id, -2)
    safe = np.maximum(ids, 0)
    missing = ids < 0
    theirs = ~missing & (t.col["writer"][safe] != wid)
    todo = ~missing & ~theirs & (t.col["state"][safe] == WRITING)
    for j in np.nonzero(missing | theirs)[0].tolist():
        results[j] = _end_error(keys[j], bool(missing[j]))
    commit = np.nonzero(todo)[0]
    if len(commit) > 1 and len(np.unique(ids[commit])) < len(commit):
        _, first = np.unique(ids[commit], return_index=True)  # a key twice: the first commits
        commit = commit[np.sort(first)]
    if not len(commit):
        return results, {}
    at = commit.tolist()
    rows = ids[commit]
    _commit_rows(state, rows, [keys[j] for j in at], checksums, at, now)
    return results, _after_commit(state, rows, at)


def _end_error(key: str, missing: bool) -> KVStoreError:
    if missing:
        return NotFoundError(f"no put in progress for {key!r} (revoked or timed out?)")
    return ExistsError(f"{key!r} is written by another client")


def _commit_few(
    state: MasterState, client_id: str, keys: Sequence[str], checksums: Sequence[int],
    now: float, results: list[KVStoreError | None],
) -> tuple[list[KVStoreError | None], dict[int, list[int]]]:  # fmt: skip
    """`put_end` key by key (small batches): the same steps as `_commit_rows` and
    `_after_commit`, in key order."""
    t = state.objects
    wid = t.writer_ids.get(client_id, -2)
    waits: dict[int, list[int]] = {}
    for j, key in enumerate(keys):
        i = t.index.find(key)
        if i < 0 or t.writer_v[i] != wid:
            results[j] = _end_error(key, i < 0)
            continue
        if t.state_v[i] != WRITING:  # committed (maybe by this batch: the key twice)
            continue
        t.state_v[i] = COMPLETE
        t.checksum_v[i] = checksums[j] if checksums else 0
        del state.writing[keys[j]]
        extra = t.extra.get(i)
        for seg in ([t.segments[t.seg_v[i]]] if extra is None else
                    [state.registry.segments[(r.node_id, r.segment)] for r in extra]):  # fmt: skip
            seg.counters.bytes_in += t.size_v[i]
        ttl = t.pin_ttl.pop(i, 0.0)
        if ttl:
            t.pin_v[i] = max(t.pin_v[i], now + ttl)
        g = t.group_v[i]
        state.groups.touch_node(~g if g >= 0 else i)
        if state.journaled or extra is not None or state.durable_slots()[t.seg_v[i]]:
            obj = t.view(i)
            if state.journaled:
                state.journal.save_object(obj)
            task_ids = state.tiering.persist(obj)
            if task_ids:
                waits[j] = task_ids
    return results, waits


def _commit_rows(
    state: MasterState, rows: np.ndarray, keys: list[str], checksums: Sequence[int],
    at: list[int], now: float,
) -> None:  # fmt: skip
    t = state.objects
    t.col["state"][rows] = COMPLETE
    if checksums:
        t.col["checksum"][rows] = np.array([checksums[j] for j in at], np.uint64)
    for key in keys:
        del state.writing[key]
    count_bytes(state, rows, "bytes_in")
    if t.pin_ttl:
        for i in rows.tolist():
            ttl = t.pin_ttl.pop(i, 0.0)
            if ttl:
                t.pin_v[i] = max(t.pin_v[i], now + ttl)
    state.groups.touch_ids(rows)


def _after_commit(state: MasterState, rows: np.ndarray, at: list[int]) -> dict[int, list[int]]:
    """Journal the committed rows and queue PERSIST tasks of their durable replicas, in
    key order; (key index -> task ids) to wait on."""
    t = state.objects
    need = state.durable_slots()[t.col["seg"][rows]]
    if t.extra:
        need |= np.fromiter((i in t.extra for i in rows.tolist()), bool, len(rows))
    if state.journaled:
        need[:] = True
    waits: dict[int, list[int]] = {}
    for j in np.nonzero(need)[0].tolist():
        obj = t.view(int(rows[j]))
        if state.journaled:
            state.journal.save_object(obj)
        task_ids = state.tiering.persist(obj)
        if task_ids:
            waits[at[j]] = task_ids
    return waits


def count_bytes(
    state: MasterState, rows: np.ndarray, counter: str, first_only: bool = False
) -> None:
    """Add each row's size to `counter` of the segments of its replicas (or its first)."""
    t = state.objects
    slots = t.col["seg"][rows]
    sizes = t.col["size"][rows]
    if t.extra:
        multi = [j for j, i in enumerate(rows.tolist()) if i in t.extra]
        keep = np.ones(len(rows), bool)
        keep[multi] = False
        for j in multi:
            locs = t.extra[int(rows[j])]
            for r in locs[:1] if first_only else locs:
                seg = t.segments[t.slot_of(r)].counters
                setattr(seg, counter, getattr(seg, counter) + int(sizes[j]))
        slots, sizes = slots[keep], sizes[keep]
    if not len(slots):
        return
    lo, hi = int(slots.min()), int(slots.max())
    for slot in [lo] if lo == hi else np.unique(slots).tolist():
        add = int(sizes.sum()) if lo == hi else int(sizes[slots == slot].sum())
        seg = t.segments[slot].counters
        setattr(seg, counter, getattr(seg, counter) + add)
