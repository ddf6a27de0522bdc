"""Admin operations on the master's metadata: evict, pin / unpin, inspect, cordon, and
who holds each read lease. Synchronous, no grpc: the master service calls these.

    evict(state, EvictSpec(prefix="chat-1/"))                  # keys, prefix, or
    evict(state, EvictSpec(tier=Tier.DRAM, watermark=0.5))     # a tier down to a watermark
    pin(state, ["k"], 60.0); unpin(state, ["k"]); inspect(state, "k")
    cordon(state, "node-1", True)                              # no new replica there

`ReaderBook` remembers, per key, the one reader whose lease is live (or that several
are): a lease held by the caller alone does not block the caller's own remove (a
client that just read a key may delete it), while anyone else's lease still does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvstore.errors import BadRequestError, KVStoreError, NotFoundError, NotReadyError
from kvstore.master import leases
from kvstore.master.eviction import group_evictable
from kvstore.master.metadata import MasterState
from kvstore.master.model import ObjectMeta, ObjectState
from kvstore.master.objects import NO_READER, ObjectTable
from kvstore.types import Tier

MAX_LISTED_KEYS = 1000
SHARED = "\x00shared"  # more than one reader (or an anonymous one) holds a live lease


@dataclass(frozen=True, slots=True)
class EvictSpec:
    """What to evict: named keys, a prefix, or a tier down to a watermark (exactly one)."""

    keys: tuple[str, ...] = ()
    prefix: str = ""
    tier: Tier | None = None
    watermark: float = 0.0
    force: bool = False
    dry_run: bool = False

    def __post_init__(self) -> None:
        chosen = sum([bool(self.keys), bool(self.prefix), self.tier is not None])
        if chosen != 1:
            raise BadRequestError("evict needs exactly one of: keys, a prefix, a tier")
        if self.tier is not None and not 0.0 <= self.watermark < 1.0:
            raise BadRequestError(f"watermark must be in [0, 1), got {self.watermark}")
        if self.tier is not None and self.force:
            raise BadRequestError("a tier eviction never forces: leases and pins hold")


@dataclass(slots=True)
class EvictResult:
    evicted: int = 0
    freed_bytes: int = 0
    skipped: int = 0
    missing: int = 0
    keys: list[str] = field(default_factory=list)

    def add(self, obj: ObjectMeta) -> None:
        self.evicted += 1
        self.freed_bytes += obj.size * len(obj.replicas)
        if len(self.keys) < MAX_LISTED_KEYS:
            self.keys.append(obj.key)


def evict(state: MasterState, spec: EvictSpec) -> EvictResult:
    """Evict what `spec` names; leased, pinned or in-flight objects are skipped (keys and
    prefix: unless `force`)."""
    if spec.tier is not None:
        return _evict_tier(state, spec.tier, spec.watermark, spec.dry_run)
    keys = list(spec.keys) or sorted(k for k in state.objects if k.startswith(spec.prefix))
    out = EvictResult()
    now = state.clock()
    for key in keys:
        obj = state.objects.get(key)
        if obj is None:
            out.missing += 1
        elif obj.state is ObjectState.WRITING or (obj.protected(now) and not spec.force):
            out.skipped += 1
        else:
            out.add(obj)
            if not spec.dry_run:
                state.remove([key], force=True)
    return out


def tier_usage(state: MasterState, tier: Tier) -> tuple[int, int]:
    """(used, capacity) bytes of every mounted segment of `tier`."""
    segs = [s for s in state.registry.segments.values() if s.tier == tier]
    return sum(s.used for s in segs), sum(s.capacity for s in segs)


def _evict_tier(state: MasterState, tier: Tier, watermark: float, dry_run: bool) -> EvictResult:
    """LRU groups with a replica in `tier`, whole, until its use is at most `watermark`."""
    used, capacity = tier_usage(state, tier)
    target = watermark * capacity
    out = EvictResult()
    now = state.clock()
    for group in state.groups.oldest_first():
        if used <= target:
            break
        members = [state.objects[k] for k in sorted(state.groups.members(group))]
        in_tier = sum(r.length for o in members for r in o.replicas if r.tier == tier)
        if not in_tier:
            continue
        if not group_evictable(frozenset(o.key for o in members), state.objects, now):
            out.skipped += len(members)
            continue
        for obj in members:
            out.add(obj)
        used -= in_tier
        if not dry_run:
            state.remove([o.key for o in members], force=True)
    return out


def pin(
    state: MasterState, keys: Sequence[str], ttl_s: float
) -> tuple[list[KVStoreError | None], float]:
    """Soft-pin committed keys for `ttl_s` (0 = the master's maximum); the pin granted."""
    granted = leases.pin_ttl(state.config, ttl_s or state.config.max_pin_ttl_s)
    now = state.clock()
    results: list[KVStoreError | None] = []
    for key in keys:
        obj = state.objects.get(key)
        err = _committed(obj, key)
        if err is None and obj is not None:
            leases.extend_pin(obj, now, granted)
        results.append(err)
    return results, granted


def unpin(state: MasterState, keys: Sequence[str]) -> list[KVStoreError | None]:
    """Lift the pins of `keys` (read leases stay: they protect readers in flight)."""
    results: list[KVStoreError | None] = []
    for key in keys:
        obj = state.objects.get(key)
        err = _committed(obj, key)
        if err is None and obj is not None:
            obj.pin_until = 0.0
        results.append(err)
    return results


def _committed(obj: ObjectMeta | None, key: str) -> KVStoreError | None:
    if obj is None:
        return NotFoundError(f"unknown key {key!r}")
    if obj.state is not ObjectState.COMPLETE:
        return NotReadyError(f"{key!r} is still being written")
    return None


@dataclass(frozen=True, slots=True)
class Inspection:
    obj: ObjectMeta
    age_s: float
    group_members: int
    lease_holder: str


def inspect(state: MasterState, key: str, book: ReaderBook | None = None) -> Inspection:
    """Everything the master knows about one key; NotFoundError when absent."""
    obj = state.objects.get(key)
    if obj is None:
        raise NotFoundError(f"unknown key {key!r}")
    now = state.clock()
    holder = book.holder(key, now) if book is not None else ""
    members = len(state.groups.members(obj.group))
    return Inspection(obj, max(0.0, now - obj.started_at), members, holder)


# ---- cordons ----------------------------------------------------------------


def cordoned(state: MasterState) -> set[str]:
    """The node ids no new replica may be placed on (`NodeRegistry.live_segments` skips
    their segments)."""
    return state.registry.cordoned


def cordon(state: MasterState, node_id: str, on: bool) -> list[str]:
    """Cordon (or uncordon) a registered node; the cordoned nodes, sorted."""
    state.registry.node(node_id)  # NotFoundError for an unknown node
    nodes = cordoned(state)
    if on:
        nodes.add(node_id)
    else:
        nodes.discard(node_id)
    return sorted(nodes)


# ---- who holds a read lease -------------------------------------------------


class ReaderBook:
    """Per key, the one reader whose lease is live, or SHARED when several (or an
    anonymous one) are. Given the master's object table, it reads the table's `reader`
    column (written with the leases by `MasterState.lookup_rows(..., reader=)`: nothing
    per key here); without one, it keeps a dict (`record`, `prune`)."""

    def __init__(self, table: ObjectTable | None = None) -> None:
        self._by_key: dict[str, tuple[str, float]] = {}
        self._t = table

    def __len__(self) -> int:
        if self._t is not None:
            return int(np.count_nonzero(self._t.col["reader"][: self._t.high] != NO_READER))
        return len(self._by_key)

    def record(self, key: str, reader: str, now: float, until: float) -> None:
        """`reader` ("" = anonymous) was granted a lease on `key` until `until`."""
        prior = self._by_key.get(key)
        if not reader or (prior is not None and prior[1] > now and prior[0] != reader):
            reader = SHARED
        if prior is not None:
            until = max(until, prior[1])
        self._by_key[key] = (reader, until)

    def record_many(self, keys: Sequence[str], reader: str, now: float, until: float) -> None:
        """`record` of each key (one lookup batch: one shared entry where nothing differs)."""
        by_key = self._by_key
        mine = (reader or SHARED, until)
        for key in keys:
            prior = by_key.get(key)
            if prior is None or (prior[1] <= until and (prior[1] <= now or prior[0] == mine[0])):
                by_key[key] = mine
            else:
                self.record(key, reader, now, until)

    def holder(self, key: str, now: float) -> str:
        """The sole live lease holder of `key`; "" when none or several."""
        if self._t is not None:
            i = self._t.index.find(key)
            if i < 0 or self._t.lease_v[i] <= now or self._t.reader_v[i] < 0:
                return ""
            return self._t.writer_names[self._t.reader_v[i]]
        entry = self._by_key.get(key)
        if entry is None or entry[1] <= now or entry[0] == SHARED:
            return ""
        return entry[0]

    def only_reader(self, obj: ObjectMeta, reader: str, now: float) -> bool:
        """True when `reader` alone holds every live lease of `obj` and nothing pins it."""
        if not reader or obj.pin_until > now or obj.state is not ObjectState.COMPLETE:
            return False
        if self._t is not None:  # a reader never interned holds nothing (not even SHARED)
            rid = self._t.writer_ids.get(reader)
            return rid is not None and self._t.reader_v[obj.id] == rid
        entry = self._by_key.get(obj.key)
        return entry is not None and entry[0] == reader and entry[1] >= obj.lease_until

    def prune(self, now: float) -> int:
        """Forget expired entries; how many (a table-backed book keeps none)."""
        old = [k for k, (_, until) in self._by_key.items() if until <= now]
        for key in old:
            del self._by_key[key]
        return len(old)


def removable_by_reader(
    state: MasterState, book: ReaderBook, keys: Sequence[str], reader: str
) -> set[str]:
    """Keys a plain remove by `reader` may take despite a lease: it holds the only one."""
    now = state.clock()
    out = set()
    for key in keys:
        obj = state.objects.get(key)
        if obj is not None and obj.protected(now) and book.only_reader(obj, reader, now):
            out.add(key)
    return out
