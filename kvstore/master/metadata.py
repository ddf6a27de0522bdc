"""The master's metadata core: synchronous, deterministic, no grpc, injectable clock.

`MasterState` owns nodes/segments (`NodeRegistry`), objects and groups, and
implements the two-phase put, leased lookups, prefix matching, removal,
watermark eviction, writer-death reclaim and node-death cleanup. Batched calls
return one result per key: a value, or a `KVStoreError` instance for that key.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvstore.errors import (
    BadRequestError,
    ExistsError,
    KVStoreError,
    NoSpaceError,
    NotFoundError,
    NotReadyError,
)
from kvstore.master import leases
from kvstore.master.config import MasterConfig
from kvstore.master.eviction import GroupIndex, evictable_groups
from kvstore.master.extents import CommitItem, Extent, Extents
from kvstore.master.journal import MetaJournal, NullJournal
from kvstore.master.liveness import AllocatorFactory, NodeRegistry, default_allocator
from kvstore.master.model import (
    Counters,
    Endpoint,
    ObjectMeta,
    ObjectState,
    PutItem,
    Segment,
)
from kvstore.master.placement import place, rank_segments
from kvstore.master.tiering import MoveResult, Tiering, same_replica
from kvstore.types import Location, Tier, check_key

Clock = Callable[[], float]
KeyError_ = KVStoreError | None


class MasterState:
    """All metadata of one pool. Not thread-safe: the service calls it from one loop."""

    def __init__(
        self,
        config: MasterConfig,
        clock: Clock = time.monotonic,
        allocator_factory: AllocatorFactory = default_allocator,
        journal: MetaJournal | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.registry = NodeRegistry(config.node_ttl_s, allocator_factory)
        self.objects: dict[str, ObjectMeta] = {}
        self.groups = GroupIndex()
        self.writing: dict[str, float] = {}  # key -> started_at, oldest first
        self.counters = Counters()
        self.journal: MetaJournal = journal or NullJournal()
        self.tiering = Tiering(self)
        self.extents = Extents(self._segment_or_none, config.extent_ttl_s)

    # ---- nodes and segments -------------------------------------------------

    def register_node(self, node_id: str, endpoint: Endpoint, incarnation: str = "") -> None:
        """Register (or re-register) a node. A new `incarnation` of a known node is a
        restarted process: the moves its predecessor had in flight are void."""
        old = self.registry.nodes.get(node_id)
        if old is None or old.incarnation != incarnation:
            self.tiering.on_restart(node_id)
        node = self.registry.register(node_id, endpoint, self.clock(), incarnation)
        self.journal.save_node(node)

    def heartbeat(self, node_id: str) -> None:
        self.registry.heartbeat(node_id, self.clock())

    def mount_segment(
        self, node_id: str, name: str, tier: Tier, capacity: int, alignment: int = 0,
        shm: bool = False,
    ) -> Segment:  # fmt: skip
        """Mount (or remount) a segment; `shm`: same-host peers may map it by name."""
        align = alignment or self.config.default_alignment
        seg, changed = self.registry.mount(node_id, name, tier, capacity, align, shm)
        self.tiering.segments_changed()
        if changed:
            self.journal.save_segment(seg)
        return seg

    def unmount_segment(self, node_id: str, name: str) -> tuple[int, int]:
        """Unmount; drop every replica in it. Returns (dropped replicas, removed objects)."""
        self.registry.segment(node_id, name)
        self.tiering.on_unmount(node_id, name)
        self.extents.on_unmount(node_id, name)
        seg = self.registry.unmount(node_id, name)
        self.tiering.segments_changed()
        self.journal.drop_segment(node_id, name)
        dropped = removed = 0
        for key in sorted(seg.keys):
            obj = self.objects[key]
            obj.replicas = [r for r in obj.replicas if (r.node_id, r.segment) != (node_id, name)]
            obj.wire = None
            dropped += 1
            if obj.state is ObjectState.WRITING or not obj.replicas:
                self._drop(obj)
                removed += 1
            else:
                self.journal.save_object(obj)
        self.counters.dropped_replicas += dropped
        return dropped, removed

    # ---- two-phase put ------------------------------------------------------

    def put_start(
        self, client_id: str, client_node: str, items: Sequence[PutItem]
    ) -> list[list[Location] | KVStoreError]:
        """Reserve space for each new key; exactly one concurrent writer of a key wins."""
        now = self.clock()
        out = [self._put_one(client_id, client_node, item, now) for item in items]
        self.evict_to_watermark()
        return out

    def _put_one(
        self, client_id: str, client_node: str, item: PutItem, now: float
    ) -> list[Location] | KVStoreError:
        old = self.objects.get(item.key)
        if old is not None and not self._stale_write(old, now):
            what = "being written" if old.state is ObjectState.WRITING else "committed"
            return ExistsError(f"key {item.key!r} is already {what}")
        if old is not None:
            self._reclaim(old)
        locs = self._place_or_evict(item, client_node)
        if locs is None:
            return NoSpaceError(
                f"no room for {item.size} bytes x {item.replicas} replicas of {item.key!r}"
            )
        group = item.group or item.key
        obj = ObjectMeta(item.key, item.size, group, ObjectState.WRITING, locs, client_id, now)
        obj.pin_ttl_s = leases.pin_ttl(self.config, item.pin_ttl_s)
        self.objects[item.key] = obj
        self.writing[item.key] = now
        self.groups.add(group, item.key)
        for loc in locs:
            self.registry.segment(loc.node_id, loc.segment).keys.add(item.key)
        return locs

    def _place_or_evict(self, item: PutItem, client_node: str) -> list[Location] | None:
        """Place `item`; if the pool is full, evict LRU groups that free a usable tier."""
        locs = place(self.registry.live_segments(), item, client_node)
        if locs is not None or not self._could_ever_fit(item):
            return locs
        for group in evictable_groups(self.groups, self.objects, self.clock()):
            if item.tier is not None and not self._group_uses_tier(group, item.tier):
                continue
            self._evict_group(group)
            locs = place(self.registry.live_segments(), item, client_node)
            if locs is not None:
                return locs
        return None

    def _could_ever_fit(self, item: PutItem) -> bool:
        """Whether an empty pool could place `item` (else eviction would be pointless)."""
        nodes = {
            s.node_id
            for s in self.registry.live_segments()
            if s.capacity >= item.size and (item.tier is None or s.tier == item.tier)
        }
        return len(nodes) >= item.replicas

    def _group_uses_tier(self, group: str, tier: Tier) -> bool:
        return any(
            r.tier == tier for key in self.groups.members(group) for r in self.objects[key].replicas
        )

    def put_end(
        self, client_id: str, keys: Sequence[str], checksums: Sequence[int] = ()
    ) -> list[KeyError_]:
        """Commit: the keys become visible to lookups. Committing twice is OK."""
        return self.put_end_durable(client_id, keys, checksums)[0]

    def put_end_durable(
        self, client_id: str, keys: Sequence[str], checksums: Sequence[int] = ()
    ) -> tuple[list[KeyError_], dict[int, list[int]]]:
        """`put_end`, plus (index -> PERSIST task ids) of the keys with durable replicas:
        the caller answers once the nodes have indexed them."""
        if checksums and len(checksums) != len(keys):
            raise BadRequestError(f"{len(checksums)} checksums for {len(keys)} keys")
        now = self.clock()
        results: list[KeyError_] = []
        waits: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            res = self._end_one(client_id, key, now, checksums[i] if checksums else 0)
            if isinstance(res, ObjectMeta):  # committed by this call
                ids = self.tiering.persist(res)
                if ids:
                    waits[i] = ids
                res = None
            results.append(res)
        return results, waits

    def _end_one(
        self, client_id: str, key: str, now: float, checksum: int = 0
    ) -> KeyError_ | ObjectMeta:
        """The key's error, None if it was already committed, or the object it commits."""
        obj = self.objects.get(key)
        if obj is None:
            return NotFoundError(f"no put in progress for {key!r} (revoked or timed out?)")
        if obj.writer != client_id:
            return ExistsError(f"{key!r} is written by another client")
        if obj.state is ObjectState.COMPLETE:
            return None
        obj.state = ObjectState.COMPLETE
        obj.checksum = checksum
        del self.writing[key]
        for loc in obj.replicas:
            self.registry.segment(loc.node_id, loc.segment).counters.bytes_in += obj.size
        leases.extend_pin(obj, now, obj.pin_ttl_s)
        self.groups.touch(obj.group)
        self.journal.save_object(obj)
        return obj

    # ---- extent leases (kvstore.master.extents) -----------------------------

    def grant_extent(
        self, client_id: str, client_node: str, size: int, min_size: int, release: int = 0
    ) -> Extent:
        """Lease `client_id` a range of a memory segment of `min_size`..`size` bytes,
        placed like a put (see `_place_extent`); `release` an older one first."""
        now = self.clock()
        if release:
            with contextlib.suppress(NotFoundError):
                self.extents.release(self.extents.owned(client_id, release, now))
        if not 0 < min_size <= size <= self.config.max_extent_bytes:
            raise BadRequestError(
                f"extent of {min_size}..{size} bytes: need 0 < min <= size <= "
                f"{self.config.max_extent_bytes}"
            )
        loc = self._place_extent(client_id, client_node, size, min_size)
        if loc is None:  # the client's puts go by PutStart (which may offload or evict)
            raise NoSpaceError(f"no memory segment is where a put of {min_size} bytes goes")
        locs = [loc]
        ext = self.extents.add(client_id, locs[0], now)
        self.evict_to_watermark()
        return ext

    def _place_extent(
        self, client_id: str, client_node: str, size: int, min_size: int
    ) -> Location | None:
        """An extent goes where a put of its size would (the client's node first, then
        the fastest tier), but only to a memory tier and never by evicting: when that
        place is an SSD or full, None. At most a 16th of the segment it lands in."""
        ranked = rank_segments(
            self.registry.live_segments(), PutItem(f"extent/{client_id}", min_size), client_node
        )
        if not ranked or ranked[0].tier == Tier.SSD:
            return None
        seg = ranked[0]
        for want in (max(min_size, min(size, seg.capacity // 16)), min_size):
            offset = seg.allocate(want)
            if offset is not None:
                return Location(seg.node_id, seg.tier, seg.name, offset, want)
        return None

    def commit_extent(
        self, client_id: str, extent_id: int, items: Sequence[CommitItem], release: bool = False
    ) -> list[KeyError_]:
        """Make objects written inside the client's extent visible (NotFoundError for the
        whole call once its lease ended); a result per item. Renews the lease."""
        now = self.clock()
        ext = self.extents.owned(client_id, extent_id, now)
        results = [self._commit_placed(client_id, ext, item, now) for item in items]
        self.extents.renew(ext, now)
        if release:
            self.extents.release(ext)
        return results

    def _commit_placed(
        self, client_id: str, ext: Extent, item: CommitItem, now: float
    ) -> KeyError_:
        try:
            check_key(item.key)
        except BadRequestError as exc:
            return exc
        old = self.objects.get(item.key)
        if old is not None and not self._stale_write(old, now):
            what = "being written" if old.state is ObjectState.WRITING else "committed"
            return ExistsError(f"key {item.key!r} is already {what}")
        loc = self.extents.carve(ext, item)
        if isinstance(loc, KVStoreError):
            return loc
        if old is not None:
            self._reclaim(old)
        group = item.group or item.key
        obj = ObjectMeta(item.key, item.size, group, ObjectState.WRITING, [loc], client_id, now)
        self.objects[item.key] = obj
        self.writing[item.key] = now
        self.groups.add(group, item.key)
        self.registry.segment(loc.node_id, loc.segment).keys.add(item.key)
        res = self._end_one(client_id, item.key, now, item.checksum)
        return None if isinstance(res, ObjectMeta) else res

    def _segment_or_none(self, node_id: str, name: str) -> Segment | None:
        return self.registry.segments.get((node_id, name))

    def put_revoke(self, client_id: str, keys: Sequence[str]) -> list[KeyError_]:
        """Abort puts in progress and free their space."""
        return [self._revoke_one(client_id, key) for key in keys]

    def _revoke_one(self, client_id: str, key: str) -> KeyError_:
        obj = self.objects.get(key)
        if obj is None:
            return NotFoundError(f"no put in progress for {key!r}")
        if obj.writer != client_id:
            return ExistsError(f"{key!r} is written by another client")
        if obj.state is ObjectState.COMPLETE:
            return NotReadyError(f"{key!r} is committed: use remove")
        self._drop(obj)
        return None

    # ---- reads --------------------------------------------------------------

    def lookup(
        self, keys: Sequence[str], lease_ttl_s: float = 0.0, pin_ttl_s: float = 0.0
    ) -> tuple[list[ObjectMeta | KVStoreError], float]:
        """COMPLETE objects of `keys`, each leased (and optionally pinned); the lease TTL."""
        now = self.clock()
        ttl = leases.lease_ttl(self.config, lease_ttl_s)
        pin = leases.pin_ttl(self.config, pin_ttl_s)
        return [self._lookup_one(key, now, ttl, pin) for key in keys], ttl

    def _lookup_one(
        self, key: str, now: float, ttl: float, pin: float
    ) -> ObjectMeta | KVStoreError:
        obj = self.objects.get(key)
        if obj is None or obj.state is not ObjectState.COMPLETE:
            self.counters.misses += 1
            if obj is None:
                return NotFoundError(f"unknown key {key!r}")
            return NotReadyError(f"{key!r} is still being written")
        self.counters.hits += 1
        first = obj.replicas[0]
        seg = self.registry.segments[(first.node_id, first.segment)].counters
        seg.hits += 1
        seg.bytes_out += obj.size
        leases.extend_lease(obj, now, ttl)
        leases.extend_pin(obj, now, pin)
        self.groups.touch(obj.group)
        self.tiering.on_hit(obj)
        return obj

    def peek(self, keys: Sequence[str]) -> list[ObjectMeta | KVStoreError]:
        """COMPLETE objects of `keys` with no side effect: no lease, LRU touch or counter."""
        return [self._peek_one(key) for key in keys]

    def _peek_one(self, key: str) -> ObjectMeta | KVStoreError:
        obj = self.objects.get(key)
        if obj is None:
            return NotFoundError(f"unknown key {key!r}")
        if obj.state is not ObjectState.COMPLETE:
            return NotReadyError(f"{key!r} is still being written")
        return obj

    def remove(self, keys: Sequence[str], force: bool = False) -> list[KeyError_]:
        """Remove committed keys; leased or pinned ones only with `force`."""
        now = self.clock()
        return [self._remove_one(key, force, now) for key in keys]

    def _remove_one(self, key: str, force: bool, now: float) -> KeyError_:
        obj = self.objects.get(key)
        if obj is None:
            return NotFoundError(f"unknown key {key!r}")
        if obj.state is ObjectState.WRITING:
            return NotReadyError(f"{key!r} is being written: the writer must revoke")
        if obj.protected(now) and not force:
            return NotReadyError(f"{key!r} is leased or pinned")
        self._drop(obj)
        return None

    # ---- background duties --------------------------------------------------

    def tick(self) -> tuple[list[str], int, int]:
        """Periodic duties: (dead nodes dropped, stale puts reclaimed, objects evicted)."""
        dead = self.expire_nodes()
        reclaimed = self.reclaim_stale_puts()
        self.extents.expire(self.clock())
        self.tiering.drop_deferred()
        evicted = self.evict_to_watermark()
        return dead, reclaimed, evicted

    def expire_nodes(self) -> list[str]:
        """Declare silent nodes dead: unmount their segments, drop their replicas."""
        dead = self.registry.dead_nodes(self.clock())
        for node_id in dead:
            for seg in self.registry.segments_of(node_id):
                self.unmount_segment(node_id, seg.name)
            self.tiering.on_restart(node_id)  # no FORGET of its index may reach a successor
            self.registry.forget(node_id)
            self.journal.drop_node(node_id)
        self.counters.dead_nodes += len(dead)
        return dead

    def reclaim_stale_puts(self) -> int:
        """Revoke puts whose writer did not commit within `put_timeout_s`."""
        now = self.clock()
        stale = []
        for key, started in self.writing.items():
            if now - started <= self.config.put_timeout_s:
                break  # insertion order is start order
            stale.append(key)
        for key in stale:
            self._reclaim(self.objects[key])
        return len(stale)

    def evict_to_watermark(self) -> int:
        """Every segment past its tier's high watermark is brought down to the low one:
        its coldest evictable objects move to a slower tier of the same node, or leave
        (see kvstore.master.tiering). Returns the objects evicted from the pool."""
        return self.tiering.rebalance()

    # ---- tiers: replicas coming and going -----------------------------------

    def complete_moves(self, node_id: str, results: Sequence[MoveResult]) -> list[MoveResult]:
        """Apply a node's task results (see kvstore.master.tiering)."""
        return self.tiering.complete(node_id, results)

    def add_replica(self, obj: ObjectMeta, loc: Location) -> None:
        """List a new replica (fastest tier first) of a COMPLETE object."""
        obj.replicas.append(loc)
        obj.replicas.sort(key=lambda r: int(r.tier))
        obj.wire = None
        self.registry.segment(loc.node_id, loc.segment).keys.add(obj.key)
        self.journal.save_object(obj)

    def drop_replica(self, obj: ObjectMeta, loc: Location, evicted: bool = False) -> None:
        """Drop one replica (the object goes with its last one)."""
        if len(obj.replicas) == 1:
            if evicted:
                self.evict_object(obj)
            else:
                self._drop(obj)
            return
        obj.replicas = [r for r in obj.replicas if r is not loc]
        obj.wire = None
        seg = self.registry.segments.get((loc.node_id, loc.segment))
        if seg is not None:
            seg.release(loc.offset)
            seg.keys.discard(obj.key)
            if evicted:
                seg.counters.evictions += 1
        self.tiering.forget(obj.key, loc)
        self.journal.save_object(obj)

    def evict_object(self, obj: ObjectMeta) -> None:
        """Evict one object from the pool (counted as an eviction)."""
        for loc in obj.replicas:
            self.registry.segment(loc.node_id, loc.segment).counters.evictions += 1
        self._drop(obj)
        self.counters.evictions += 1

    def drop_corrupt(self, obj: ObjectMeta, loc: Location) -> None:
        """A replica failed its checksum: never serve it again."""
        seg = self.registry.segments.get((loc.node_id, loc.segment))
        if seg is not None:
            seg.counters.corrupt += 1
        self.counters.corrupt_replicas += 1
        self.drop_replica(obj, loc)

    def report_corrupt(self, pairs: Sequence[tuple[str, Location]]) -> int:
        """Readers say these replicas failed their checksum; replicas dropped."""
        dropped = 0
        for key, loc in pairs:
            obj = self.objects.get(key)
            if obj is None or obj.state is not ObjectState.COMPLETE:
                continue
            replica = same_replica(obj, loc)
            if replica is not None:
                self.drop_corrupt(obj, replica)
                dropped += 1
        return dropped

    def report_unreachable(self, node_ids: Sequence[str]) -> list[str]:
        """Clients could not reach these nodes' data plane: fence each known one for
        `fence_s` (no new replica goes there; reads are untouched). The fenced ids."""
        now = self.clock()
        until = now + self.config.fence_s
        return [n for n in dict.fromkeys(node_ids) if self.registry.fence(n, until, now)]

    def announce(
        self, node_id: str, name: str, found: Sequence[tuple[str, int, int, int]], complete: bool
    ) -> tuple[int, int, int, list[str]]:
        """A node lists the objects (key, offset, length, checksum) its durable segment
        holds: (adopted, known, dropped, refused keys the node must forget)."""
        from kvstore.master.announce import adopt

        return adopt(self, node_id, name, found, complete)

    # ---- internals ----------------------------------------------------------

    def _stale_write(self, obj: ObjectMeta, now: float) -> bool:
        return obj.state is ObjectState.WRITING and now - obj.started_at > self.config.put_timeout_s

    def _reclaim(self, obj: ObjectMeta) -> None:
        self._drop(obj)
        self.counters.reclaimed_puts += 1

    def _evict_group(self, group: str) -> int:
        members = sorted(self.groups.members(group))
        for key in members:
            obj = self.objects[key]
            for loc in obj.replicas:
                self.registry.segment(loc.node_id, loc.segment).counters.evictions += 1
            self._drop(obj)
        self.counters.evictions += len(members)
        return len(members)

    def _drop(self, obj: ObjectMeta) -> None:
        """Forget `obj` and free the space of its replicas on mounted segments."""
        self.tiering.on_drop(obj)
        for loc in obj.replicas:
            seg = self.registry.segments.get((loc.node_id, loc.segment))
            if seg is not None:
                seg.release(loc.offset)
                seg.keys.discard(obj.key)
                self.tiering.forget(obj.key, loc)
        del self.objects[obj.key]
        self.writing.pop(obj.key, None)
        self.groups.discard(obj.group, obj.key)
        if obj.state is ObjectState.COMPLETE:
            self.journal.drop_object(obj.key)

    # ---- integrity and restore ----------------------------------------------

    def check_integrity(self) -> None:
        """Assert every cross-index invariant (tests call this after each step)."""
        self.registry.check_integrity()
        self.groups.check_integrity(self.objects)
        by_segment: dict[tuple[str, str], set[str]] = {k: set() for k in self.registry.segments}
        for key, obj in self.objects.items():
            assert obj.key == key, f"object indexed under {key!r} is {obj.key!r}"
            assert obj.replicas, f"{key!r} has no replica"
            # Replicas for redundancy sit on distinct nodes; one node may also hold a copy
            # in another tier (a promotion keeps its SSD copy), never two in one tier.
            places = [(r.node_id, r.tier) for r in obj.replicas]
            assert len(set(places)) == len(places), f"{key!r} has two replicas in one tier"
            assert (key in self.writing) == (obj.state is ObjectState.WRITING), key
            for loc in obj.replicas:
                seg = self.registry.segments[(loc.node_id, loc.segment)]
                assert seg.allocator.size_of(loc.offset) >= loc.length, f"{key!r} range"
                by_segment[(loc.node_id, loc.segment)].add(key)
        for k, seg in self.registry.segments.items():
            assert seg.keys == by_segment[k], f"segment {k} key index is stale"
        held = {k: 0 for k in self.registry.segments}
        for obj in self.objects.values():
            for loc in obj.replicas:
                held[(loc.node_id, loc.segment)] += seg_size(self.registry, loc)
        for node_id, name, offset, length in self.extents.pieces():
            assert self.registry.segments[(node_id, name)].allocator.size_of(offset) == length
            held[(node_id, name)] += length
        for loc in self.tiering.reserved():
            key = (loc.node_id, loc.segment)
            if key in held:
                assert self.registry.segments[key].allocator.size_of(loc.offset) >= loc.length
                held[key] += seg_size(self.registry, loc)
        for k, seg in self.registry.segments.items():
            assert held[k] == seg.used, f"segment {k}: ranges hold {held[k]}, allocator {seg.used}"
        self.tiering.check_integrity()

    def restore(self) -> int:
        """Reload nodes, segments and committed objects from the journal; objects loaded.

        Restored nodes get a fresh heartbeat deadline: those that do not heartbeat
        within `node_ttl_s` are declared dead as usual.
        """
        snap = self.journal.load()
        now = self.clock()
        for rec in snap.nodes:
            nixl = base64.b64decode(rec.get("nixl", ""))
            endpoint = Endpoint(rec["tcp"], rec["shm"], rec["rpc"], nixl, rec.get("fd", ""))
            self.registry.register(rec["id"], endpoint, now)
        for rec in snap.segments:
            self.registry.mount(
                rec["node"], rec["name"], Tier(rec["tier"]), rec["capacity"], rec["alignment"],
                rec.get("shm", False),
            )  # fmt: skip
        for rec in snap.objects:
            self._restore_object(rec, now)
        return len(self.objects)

    def _restore_object(self, rec: dict[str, Any], now: float) -> None:
        key, size, group = rec["key"], rec["size"], rec["group"]
        locs = [Location(n, Tier(t), s, o, ln) for n, t, s, o, ln in rec["replicas"]]
        for loc in locs:
            seg = self.registry.segment(loc.node_id, loc.segment)
            seg.allocator.allocate_at(loc.offset, loc.length)
            seg.keys.add(key)
        obj = ObjectMeta(key, size, group, ObjectState.COMPLETE, locs, "", now)
        obj.checksum = rec.get("checksum", 0)
        self.objects[key] = obj
        self.groups.add(group, key)


def seg_size(registry: NodeRegistry, loc: Location) -> int:
    """Bytes the allocator holds for a range at `loc` (its length, aligned up)."""
    return registry.segments[(loc.node_id, loc.segment)].allocator.size_of(loc.offset)
