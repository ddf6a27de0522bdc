"""Every object of the pool as one row of a struct of arrays, keyed by an interned id.

A row holds the object's size, state, clocks, checksum, writer, group and LRU
position in numpy columns, and its replica, when it has exactly one whose length
is the object's size (the common case), as (segment slot, offset): no Python
object exists per committed object. Objects with another number of replicas keep
a tuple of `Location`s in `extra`; in-flight moves and pending pins live in small
dicts.

`ObjectTable` is also the `Mapping[str, ObjectMeta]` the rest of the master reads
(`state.objects.get(key)`): it hands out `ObjectMeta` views of a row. Batched
callers (put, commit, lookup, the reply encoders) read the columns directly.

Segments get a slot when the master mounts them (`attach`); `Segment.keys` is
derived from the `seg` column (nothing is stored per key per segment).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from kvstore.master.keyindex import KeyIndex, zeros
from kvstore.master.model import FREE, ObjectMeta, ObjectState, Segment
from kvstore.types import Location

_I64 = np.int64
# The per-row columns, by block: a block is one (rows x columns) array, so the columns a
# lookup reads of one row share a cache line or two (at 10M rows, a random key's row
# costs 3 cache misses, not one per column). `col[name]` is a strided view of its block.
BLOCKS: tuple[tuple[type, tuple[str, ...]], ...] = (
    (np.int64, ("size", "offset", "lru", "checksum")),
    (np.float64, ("lease", "pin", "started")),
    (np.int32, ("state", "seg", "group", "writer", "reader", "slow", "hits")),
)
_AS = {"checksum": np.uint64}  # columns stored in another dtype's block, viewed as theirs
COLUMNS = [name for _, names in BLOCKS for name in names]
NO_READER, SHARED_READER = -1, -2  # `reader` column: none recorded; several (or anonymous)
MAX_HITS = (1 << 31) - 1  # `hits` (lookup hits since the object was born) saturates here
# The master's metadata memory per object beyond its key's bytes: its row (80 B), its
# key-index entry (24 B) and hash slot (~8 B at the index's load), its group's share and
# allocator state; bench/master.py measures ~148 B of RSS per object with 40-byte keys.
OBJECT_BYTES = 120
REPLICA_BYTES = 96  # each replica past the first: a `Location` kept in `extra`


def tenant_of(key: str) -> str:
    """The tenant of a wire key: its head before "/" ("" for a key without one)."""
    head, sep, _ = key.partition("/")
    return head if sep else ""


class Usage:
    """What the objects hold, kept as they are born and dropped, so the master's guard
    admits a put in O(1): `metadata`, the estimated metadata memory of every object, and,
    where quotas are on, `tenant_bytes`: size x replicas asked, per tenant (see
    kvstore.security.tenants). Nothing here is stored per object; a row born with more
    than one replica notes its count in `ObjectTable.copies`."""

    def __init__(self, per_tenant: bool) -> None:
        self.metadata = 0
        self.tenant_bytes: dict[str, int] | None = {} if per_tenant else None
        self._objects: dict[str, int] = {}  # tenant -> objects (an entry leaves at 0)

    def add(self, key: str, size: int, copies: int) -> None:
        self.metadata += OBJECT_BYTES + len(key) + REPLICA_BYTES * (copies - 1)
        if self.tenant_bytes is not None:
            self._credit(tenant_of(key), size * copies, 1)

    def add_many(self, keys: Sequence[str], sizes: np.ndarray) -> None:
        """Objects of one replica each."""
        self.metadata += OBJECT_BYTES * len(keys) + sum(map(len, keys))
        if self.tenant_bytes is None:
            return
        held: dict[str, list[int]] = {}
        for key, size in zip(keys, sizes.tolist(), strict=True):
            acc = held.setdefault(tenant_of(key), [0, 0])
            acc[0] += size
            acc[1] += 1
        for tenant, (nbytes, count) in held.items():
            self._credit(tenant, nbytes, count)

    def drop(self, key: str, size: int, copies: int) -> None:
        self.metadata -= OBJECT_BYTES + len(key) + REPLICA_BYTES * (copies - 1)
        if self.tenant_bytes is not None:
            self._credit(tenant_of(key), -size * copies, -1)

    def _credit(self, tenant: str, nbytes: int, count: int) -> None:
        assert self.tenant_bytes is not None
        left = self._objects.get(tenant, 0) + count
        if left:
            self._objects[tenant] = left
            self.tenant_bytes[tenant] = self.tenant_bytes.get(tenant, 0) + nbytes
        else:  # a tenant's last object gone: forget the tenant (its name is a key prefix)
            self._objects.pop(tenant, None)
            self.tenant_bytes.pop(tenant, None)

    def recount(self, table: ObjectTable) -> Usage:
        """The same figures counted afresh from `table` (check_integrity)."""
        fresh = Usage(self.tenant_bytes is not None)
        for i in table.live_ids().tolist():
            fresh.add(table.index.key_of(i), table.size_v[i], table.copies.get(i, 1))
        return fresh


class ObjectTable(Mapping[str, ObjectMeta]):
    """Rows of objects; `index` maps keys to row ids."""

    # Each column's scalar view (`_grow` sets one per name in COLUMNS: `<name>_v`): a
    # memoryview of the column, typed Any since its items are ints or floats by column.
    size_v: Any
    offset_v: Any
    lru_v: Any
    checksum_v: Any
    lease_v: Any
    pin_v: Any
    started_v: Any
    state_v: Any
    seg_v: Any
    group_v: Any
    writer_v: Any
    reader_v: Any
    slow_v: Any
    hits_v: Any

    def __init__(self, per_tenant: bool = False) -> None:
        self.index = KeyIndex()
        self.usage = Usage(per_tenant)
        self.copies: dict[int, int] = {}  # row -> replicas asked, where more than one
        self.capacity = 0
        self.high = 0  # ids below this have been used at least once
        self._free = array("q")  # ids to reuse, most recently freed last
        self.extra: dict[int, tuple[Location, ...]] = {}  # rows without exactly 1 replica
        self.moving: dict[int, int] = {}  # row -> id of its tier move in flight
        self.pin_ttl: dict[int, float] = {}  # WRITING row -> pin granted at commit
        self.segments: dict[int, Segment] = {}  # slot -> mounted segment
        self._slots: dict[tuple[str, str], int] = {}  # (node, segment name) -> slot
        self._next_slot = 0
        self.group_names: dict[int, str] = {}  # gid -> name (kept by the GroupIndex)
        self.writer_ids: dict[str, int] = {"": 0}
        self.writer_names: list[str] = [""]
        self.col: dict[str, np.ndarray] = {}
        self._blocks: dict[int, np.ndarray] = {}
        self._grow(1024)

    # ---- rows ---------------------------------------------------------------

    def _grow(self, at_least: int) -> None:
        """Room for `at_least` rows (x1.5). Rows past `high` are never read, and a new
        row gets every column written: zeroed (lazily mapped) pages stay untouched."""
        size = max(at_least, int(self.capacity * 1.5), 1024)
        for b, (dtype, names) in enumerate(BLOCKS):
            block = zeros(size * len(names), dtype).reshape(size, len(names))
            if self.capacity:
                block[: self.high] = self._blocks[b][: self.high]
            self._blocks[b] = block
            for j, name in enumerate(names):
                view = block[:, j]
                self.col[name] = view.view(_AS[name]) if name in _AS else view
        self.capacity = size
        self.index.reserve_ids(size)
        for name, col in self.col.items():  # scalar access: memoryviews give Python numbers
            setattr(self, f"{name}_v", col.data)

    def new_ids(self, n: int) -> np.ndarray:
        """`n` free row ids (recycled ones first)."""
        reuse = min(n, len(self._free))
        ids = np.empty(n, _I64)
        if reuse:
            cut = len(self._free) - reuse
            ids[:reuse] = np.frombuffer(self._free, _I64)[cut:][::-1]
            del self._free[cut:]
        fresh = n - reuse
        if self.high + fresh > self.capacity:
            self._grow(self.high + fresh)
        ids[reuse:] = np.arange(self.high, self.high + fresh)
        self.high += fresh
        return ids

    def new_id(self) -> int:
        """One free row id (`new_ids` without numpy)."""
        if self._free:
            return self._free.pop()
        if self.high + 1 > self.capacity:
            self._grow(self.high + 1)
        self.high += 1
        return self.high - 1

    def free_id(self, i: int) -> None:
        """Forget row `i` (its key must be deleted from the index first)."""
        self.state_v[i] = FREE
        self.seg_v[i] = -1
        self.group_v[i] = -1
        self.lru_v[i] = -1
        self.extra.pop(i, None)
        self.copies.pop(i, None)
        self.moving.pop(i, None)
        self.pin_ttl.pop(i, None)
        self._free.append(i)

    def record_readers(self, rows: np.ndarray, reader: str, now: float) -> None:
        """`reader` ("" = anonymous) is granted a lease on `rows` at `now` (call before the
        leases are extended): a row keeps one reader while only that one holds a live
        lease, else SHARED (see kvstore.master.admin.ReaderBook)."""
        rid = self.writer_id(reader) if reader else SHARED_READER
        col = self.col["reader"]
        if len(rows) <= 16:
            for i in rows.tolist():
                if self.lease_v[i] > now and self.reader_v[i] != rid:
                    self.reader_v[i] = SHARED_READER
                else:
                    self.reader_v[i] = rid
            return
        keep = (self.col["lease"][rows] <= now) | (col[rows] == rid)
        col[rows] = np.where(keep, rid, SHARED_READER)

    def group_name(self, gid: int) -> str:
        return self.group_names[gid]

    def writer_id(self, name: str) -> int:
        """The interned id of a writer (client) name."""
        wid = self.writer_ids.get(name)
        if wid is None:
            wid = self.writer_ids[name] = len(self.writer_names)
            self.writer_names.append(name)
        return wid

    # ---- Mapping[str, ObjectMeta] --------------------------------------------

    def __len__(self) -> int:
        return self.index.live

    def __iter__(self) -> Iterator[str]:
        return iter(self.index.keys_of(self.live_ids()))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.index.find(key) >= 0

    def __getitem__(self, key: str) -> ObjectMeta:
        obj = self.get(key)
        if obj is None:
            raise KeyError(key)
        return obj

    def get(self, key: str, default: ObjectMeta | None = None) -> ObjectMeta | None:  # type: ignore[override]
        i = self.index.find(key) if isinstance(key, str) else -1
        return default if i < 0 else ObjectMeta(self, i, key)

    def view(self, i: int) -> ObjectMeta:
        return ObjectMeta(self, i, self.index.key_of(i))

    def live_ids(self) -> np.ndarray:
        return np.nonzero(self.col["state"][: self.high] != FREE)[0]

    # ---- replicas -------------------------------------------------------------

    def replicas(self, i: int) -> list[Location]:
        extra = self.extra.get(i)
        if extra is not None:
            return list(extra)
        seg = self.segments[self.seg_v[i]]
        return [Location(seg.node_id, seg.tier, seg.name, self.offset_v[i], self.size_v[i])]

    def set_replicas(self, i: int, locs: Sequence[Location]) -> None:
        """Replace row `i`'s replicas (fastest tier first, as given)."""
        if len(locs) == 1 and locs[0].length == self.size_v[i]:
            self.extra.pop(i, None)
            self.seg_v[i] = self.slot_of(locs[0])
            self.offset_v[i] = locs[0].offset
            return
        self.extra[i] = tuple(locs)
        self.seg_v[i] = self.slot_of(locs[0]) if locs else -1
        self.offset_v[i] = locs[0].offset if locs else 0

    # ---- segments -------------------------------------------------------------

    def attach(self, seg: Segment) -> None:
        """Give a newly mounted segment its slot (a remount of the same one keeps it)."""
        if seg.slot < 0 or self.segments.get(seg.slot) is not seg:
            seg.slot = self._next_slot
            self._next_slot += 1
        self.segments[seg.slot] = seg
        self._slots[(seg.node_id, seg.name)] = seg.slot
        seg.index = self

    def detach(self, seg: Segment) -> None:
        self.segments.pop(seg.slot, None)
        if self._slots.get((seg.node_id, seg.name)) == seg.slot:
            del self._slots[(seg.node_id, seg.name)]
        seg.index = None

    def slot_of(self, loc: Location) -> int:
        return self._slots[(loc.node_id, loc.segment)]

    def slot_ids(self, slot: int) -> list[int]:
        """Rows with a replica in segment `slot`, by id."""
        seg = self.segments.get(slot)
        ids = set(np.nonzero(self.col["seg"][: self.high] == slot)[0].tolist())
        if seg is not None:
            ids.update(
                i for i, locs in self.extra.items()
                if any(r.segment == seg.name and r.node_id == seg.node_id for r in locs)
            )  # fmt: skip
        return sorted(ids)

    def slot_keys(self, slot: int) -> frozenset[str]:
        return frozenset(self.index.keys_of(np.array(self.slot_ids(slot), _I64)))

    def slot_counts(self) -> dict[int, tuple[int, int]]:
        """Per slot: (replicas placed there, COMPLETE objects with a replica there)."""
        n = self.high
        seg = self.col["seg"][:n]
        state = self.col["state"][:n]
        single = (seg >= 0) & (state != FREE)
        if self.extra:
            single[list(self.extra)] = False
        done = single & (state == ObjectState.COMPLETE)
        width = max(self._next_slot, 1)
        reps = np.bincount(seg[single], minlength=width)
        comp = np.bincount(seg[done], minlength=width)
        out = {s: [int(reps[s]), int(comp[s])] for s in self.segments}
        for i, locs in self.extra.items():
            for r in locs:
                slot = self._slots.get((r.node_id, r.segment))
                if slot in out:
                    out[slot][0] += 1
                    out[slot][1] += int(self.state_v[i] == ObjectState.COMPLETE)
        return {s: (a, b) for s, (a, b) in out.items()}

    # ---- integrity ------------------------------------------------------------

    def check_integrity(self) -> None:
        live = self.live_ids()
        self.index.check_integrity(live)
        free = np.frombuffer(self._free, _I64) if len(self._free) else np.zeros(0, _I64)
        assert len(np.unique(free)) == len(free), "an id is free twice"
        assert not np.isin(free, live).any(), "a free id is live"
        assert len(free) + len(live) == self.high, "ids lost"
        for i in live.tolist():
            if i not in self.extra:
                assert self.seg_v[i] in self.segments, f"row {i} in unknown slot"
        fresh = self.usage.recount(self)
        assert fresh.metadata == self.usage.metadata, "metadata estimate drifted"
        assert fresh.tenant_bytes == self.usage.tenant_bytes, "per-tenant bytes drifted"
        for table in (self.extra, self.copies, self.moving, self.pin_ttl):
            assert all(self.state_v[i] != FREE for i in table), "a side table names a free row"
        for i in self.pin_ttl:
            assert self.state_v[i] == ObjectState.WRITING, f"committed row {i} holds a pin ttl"
