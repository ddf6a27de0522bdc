"""The master's metadata core: synchronous, deterministic, no grpc, injectable clock.

`MasterState` owns nodes/segments (`NodeRegistry`), objects and groups, and
implements the two-phase put, leased lookups, prefix matching, removal,
watermark eviction, writer-death reclaim and node-death cleanup. Batched calls
return one result per key: a value, or a `KVStoreError` instance for that key.

Objects are rows of an `ObjectTable` (kvstore.master.objects: a struct of
arrays, ~150 bytes per committed object); `objects` maps keys to `ObjectMeta`
views of them. PutStart, PutEnd and lookups run batched (kvstore.master.batch);
every object is created by `_new_objects`. Segment allocators do not track
allocations (the table holds every range): `free` is given the length.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from kvstore.errors import (
    BadRequestError,
    ExistsError,
    KVStoreError,
    NoSpaceError,
    NotFoundError,
    NotReadyError,
)
from kvstore.master import batch, commit, leases, lookups
from kvstore.master.batch import PutColumns, RowBatch
from kvstore.master.config import MasterConfig
from kvstore.master.eviction import GroupIndex, evictable_groups
from kvstore.master.extents import CommitItem, Extent, Extents
from kvstore.master.journal import MetaJournal, NullJournal
from kvstore.master.liveness import AllocatorFactory, NodeRegistry
from kvstore.master.model import (
    Counters,
    Endpoint,
    ObjectMeta,
    ObjectState,
    PutItem,
    Segment,
    SpaceAllocator,
)
from kvstore.master.objects import ObjectTable
from kvstore.master.placement import place, rank_segments
from kvstore.master.tiering import MoveResult, Tiering, is_durable, same_replica
from kvstore.master.writerleases import WriterLeases
from kvstore.types import Location, ObjectKey, Tier, check_key

Clock = Callable[[], float]
KeyError_ = KVStoreError | None
_I64 = np.int64


def master_allocator(capacity: int, alignment: int) -> SpaceAllocator:
    """A segment's allocator in the master: untracked (the object table has the ranges)."""
    from kvstore.tiers.allocator import OffsetAllocator

    return OffsetAllocator(capacity, alignment, track=False)


class MasterState:
    """All metadata of one pool. Not thread-safe: the service calls it from one loop."""

    def __init__(
        self,
        config: MasterConfig,
        clock: Clock = time.monotonic,
        allocator_factory: AllocatorFactory = master_allocator,
        journal: MetaJournal | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.registry = NodeRegistry(config.node_ttl_s, allocator_factory)
        quotas = bool(config.tenant_quota_bytes or config.tenant_quotas)
        self.objects = ObjectTable(per_tenant=quotas)  # tenants counted only where quotas are
        self.groups = GroupIndex(self.objects)
        self.writing: dict[str, float] = {}  # key -> started_at, oldest first
        self.counters = Counters()
        self.journal: MetaJournal = journal or NullJournal()
        self.journaled = not isinstance(self.journal, NullJournal)
        self.tiering = Tiering(self)
        self._durable = np.zeros(0, bool)  # per segment slot: a durable tier
        self.extents = Extents(
            self._segment_or_none, config.extent_ttl_s, journal=self.journal.save_extents
        )
        self.writer_leases = WriterLeases(config.writer_lease_ttl_s)

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
        self._attach(seg)
        if changed:
            self.journal.save_segment(seg)
        return seg

    def _attach(self, seg: Segment) -> None:
        self.objects.attach(seg)
        self.tiering.segments_changed()
        slots = self.objects.segments
        self._durable = np.zeros(max(slots, default=-1) + 1, bool)
        for slot, s in slots.items():
            self._durable[slot] = is_durable(s.tier)

    def durable_slots(self) -> np.ndarray:
        """Per segment slot: whether its tier is durable (PutEnd persists there)."""
        return self._durable

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
            dropped += 1
            if obj.state is ObjectState.WRITING or not obj.replicas:
                self._drop(obj)
                removed += 1
            else:
                self.journal.save_object(obj)
        self.objects.detach(seg)
        self.counters.dropped_replicas += dropped
        return dropped, removed

    # ---- two-phase put ------------------------------------------------------

    def put_start(
        self, client_id: str, client_node: str, items: Sequence[PutItem]
    ) -> list[list[Location] | KVStoreError]:
        """Reserve space for each new key; exactly one concurrent writer of a key wins."""
        res = self.put_start_columns(client_id, client_node, PutColumns.from_items(items))
        t = self.objects
        return [res.errors[j] if i < 0 else t.replicas(i) for j, i in enumerate(res.ids.tolist())]

    def put_start_columns(self, client_id: str, client_node: str, cols: PutColumns) -> RowBatch:
        """`put_start` of a batch given as columns: per key its new row id or its error
        (the service encodes replies from the rows)."""
        self.writer_leases.check_put(client_id, cols.keys, self.clock())
        res = batch.put_start(self, client_id, client_node, cols)
        if self.journaled:  # the writer is about to write there: a successor must know
            for i in res.ids[res.ids >= 0].tolist():
                self.journal.save_object(self.objects.view(i))
        self.evict_to_watermark()
        return res

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
        obj = self._new_object(
            item.key, item.size, item.group, ObjectState.WRITING, locs, client_id, now
        )
        ttl = leases.pin_ttl(self.config, item.pin_ttl_s)
        if ttl > 0:
            self.objects.pin_ttl[obj.id] = ttl
        return locs

    def _new_object(
        self, key: str, size: int, group: str, state: ObjectState, locs: Sequence[Location],
        writer: str, now: float, checksum: int = 0,
    ) -> ObjectMeta:  # fmt: skip
        """Create one object (see `_new_objects`); its view."""
        t = self.objects
        one = len(locs) == 1 and locs[0].length == size
        i = t.new_id()
        self._new_row(
            i, key, size, t.slot_of(locs[0]) if one else -1, locs[0].offset if one else 0,
            group, state, t.writer_id(writer), now, checksum, len(locs),
        )  # fmt: skip
        if not one:
            t.set_replicas(i, locs)
        return ObjectMeta(t, i, key)

    def _new_objects(
        self, keys: Sequence[str], sizes: np.ndarray, slots: np.ndarray, offsets: np.ndarray,
        groups: Sequence[str] | None, state: ObjectState, writer: int, now: float,
        checksums: Sequence[int] | None = None,
    ) -> np.ndarray:  # fmt: skip
        """Create objects (keys absent and distinct), each with one replica (slots[i],
        offsets[i], length sizes[i]; the space is already allocated), in group order
        (groups[i] "" = its own); WRITING ones are listed in `writing`. Their row ids.
        The one place objects are born: puts, adoption, restore and extent commits."""
        t = self.objects
        ids = t.new_ids(len(keys))
        if len(keys) == 1:  # one object (announce, restore, small puts): no numpy call per field
            self._new_row(int(ids[0]), keys[0], int(sizes[0]), int(slots[0]), int(offsets[0]),
                          groups[0] if groups else "", state, writer, now,
                          checksums[0] if checksums else 0)  # fmt: skip
            return ids
        t.index.insert_many(ids, keys)
        t.usage.add_many(keys, sizes)
        col = t.col
        col["state"][ids] = int(state)
        col["size"][ids] = sizes
        col["seg"][ids] = slots
        col["offset"][ids] = offsets
        col["lease"][ids] = 0.0
        col["pin"][ids] = 0.0
        col["started"][ids] = now
        col["checksum"][ids] = 0 if checksums is None else np.array(checksums, np.uint64)
        col["slow"][ids] = 0
        col["hits"][ids] = 0
        col["writer"][ids] = writer
        col["group"][ids] = -1
        col["lru"][ids] = -1
        col["reader"][ids] = -1
        self.groups.add_many(ids, keys, groups)
        if state is ObjectState.WRITING:
            self.writing.update(dict.fromkeys(keys, now))
        return ids

    def _new_row(
        self, i: int, key: str, size: int, slot: int, offset: int, group: str,
        state: ObjectState, writer: int, now: float, checksum: int, copies: int = 1,
    ) -> None:  # fmt: skip
        """`_new_objects` of one object, field by field (see there)."""
        t = self.objects
        t.index.insert(i, key)
        t.usage.add(key, size, copies)
        if copies > 1:
            t.copies[i] = copies
        t.state_v[i], t.size_v[i], t.seg_v[i], t.offset_v[i] = int(state), size, slot, offset
        t.lease_v[i] = t.pin_v[i] = 0.0
        t.started_v[i], t.checksum_v[i], t.slow_v[i], t.writer_v[i] = now, checksum, 0, writer
        t.hits_v[i] = 0
        t.group_v[i] = t.lru_v[i] = t.reader_v[i] = -1
        self.groups.add_one(i, key, group)
        if state is ObjectState.WRITING:
            self.writing[key] = now

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
        return commit.put_end(self, client_id, keys, checksums)

    # ---- extent leases (kvstore.master.extents) -----------------------------

    def grant_extent(
        self, client_id: str, client_node: str, size: int, min_size: int, release: int = 0,
        after: int = 0,
    ) -> Extent:  # fmt: skip
        """Lease `client_id` a range of a memory segment of `min_size`..`size` bytes,
        placed like a put (see `_place_extent`); `release` an older one first. `after`:
        the client's next extent, asked while its extent `after` still has room
        (CommitExtent), and granted only in that extent's segment: when the segment is
        full, the grant the client then asks for itself goes where a put would, as
        before (another tier, or past the watermark that starts an offload)."""
        if release:
            self.release_extent(client_id, release)
        self.check_extent_size(size, min_size)
        only = None
        if after:
            current = self.extents.live.get(after)
            if current is None or current.client_id != client_id:
                raise NoSpaceError(f"extent {after} is not a live extent of {client_id!r}")
            only = (current.node_id, current.segment)
        loc = self._place_extent(client_id, client_node, size, min_size, only)
        if loc is None:  # the client's puts go by PutStart (which may offload or evict)
            raise NoSpaceError(f"no memory segment is where a put of {min_size} bytes goes")
        ext = self.extents.add(client_id, loc, self.clock())  # journaled: a successor keeps it
        self.evict_to_watermark()
        return ext

    def check_extent_size(self, size: int, min_size: int) -> None:
        """BadRequestError unless an extent of `min_size`..`size` bytes may be asked for."""
        if not 0 < min_size <= size <= self.config.max_extent_bytes:
            raise BadRequestError(
                f"extent of {min_size}..{size} bytes: need 0 < min <= size <= "
                f"{self.config.max_extent_bytes}"
            )

    def release_extent(self, client_id: str, extent_id: int) -> None:
        """Free what `client_id` left uncommitted of its extent `extent_id` (nothing when
        that is not a live extent of this client's)."""
        with contextlib.suppress(NotFoundError):
            self.extents.release(self.extents.owned(client_id, extent_id, self.clock()))

    def _place_extent(
        self, client_id: str, client_node: str, size: int, min_size: int,
        only: tuple[str, str] | None = None,
    ) -> Location | None:  # fmt: skip
        """An extent goes where a put of its size would (the client's node first, then
        the fastest tier), but only to a memory tier and never by evicting: when that
        place is an SSD or full, None. At most a 16th of the segment it lands in.
        `only`: in that (node, segment) or nowhere."""
        ranked = rank_segments(
            self.registry.live_segments(),
            PutItem(ObjectKey(f"extent/{client_id}"), min_size),
            client_node,
        )
        if only is not None:
            ranked = [seg for seg in ranked if (seg.node_id, seg.name) == only]
        if not ranked or ranked[0].tier == Tier.SSD:
            return None
        seg = ranked[0]
        target = max(min_size, min(size, seg.capacity // 16))
        # a fragmented segment (small objects evicted here and there) has no range that
        # large: its largest free one, rather than one object's worth per grant
        for want in (target, min(target, seg.allocator.largest_free()), min_size):
            if want < min_size:
                continue
            offset = seg.allocate(want)
            if offset is not None:
                return Location(seg.node_id, seg.tier, seg.name, offset, want)
        return None

    def commit_extent(
        self, client_id: str, extent_id: int, items: Sequence[CommitItem], release: bool = False,
        read_lease_s: float = 0.0,
    ) -> list[KeyError_]:  # fmt: skip
        """Make objects written inside the client's extent visible (NotFoundError for the
        whole call once its lease ended); a result per item. Renews the lease.
        `read_lease_s` > 0: the writer holds a writer lease on each key committed
        (kvstore.master.writerleases)."""
        now = self.clock()
        try:
            ext = self.extents.owned(client_id, extent_id, now)
        except NotFoundError:
            # a retry of a call whose reply was lost (a failover) after it released the
            # extent: done already when every item is an object this writer committed
            if items and all(self._committed_as(client_id, None, it) for it in items):
                return [None] * len(items)
            raise
        results = [self._commit_placed(client_id, ext, item, now) for item in items]
        if read_lease_s > 0:
            done = (it.key for it, err in zip(items, results, strict=True) if err is None)
            self.writer_leases.grant(client_id, done, read_lease_s, now)
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
        refused = self.writer_leases.tombstone(item.key, client_id, now)
        if refused is not None:
            return refused
        old = self.objects.get(item.key)
        if old is not None and not self._stale_write(old, now):
            if self._committed_as(client_id, ext, item):
                return None  # a retried commit (its reply lost in a failover): done already
            what = "being written" if old.state is ObjectState.WRITING else "committed"
            return ExistsError(f"key {item.key!r} is already {what}")
        loc = self.extents.carve(ext, item)
        if isinstance(loc, KVStoreError):
            return loc
        if old is not None:
            self._reclaim(old)
        obj = self._new_object(
            item.key, item.size, item.group, ObjectState.COMPLETE, [loc], client_id, now,
            item.checksum,
        )  # fmt: skip
        self.registry.segment(loc.node_id, loc.segment).counters.bytes_in += item.size
        self.groups.touch_id(obj.id)  # as a commit touches its group
        self.journal.save_object(obj)
        return None

    def _committed_as(self, client_id: str, ext: Extent | None, item: CommitItem) -> bool:
        """`item` is already committed, by this writer, at this place of `ext` (any extent
        of the writer when None: a released one), with these bytes (the checksum)."""
        obj = self.objects.get(item.key)
        if obj is None or obj.state is not ObjectState.COMPLETE or obj.writer != client_id:
            return False
        if obj.size != item.size or obj.checksum != item.checksum:
            return False
        return any(
            loc.offset == item.offset
            and (ext is None or (loc.node_id, loc.segment) == (ext.node_id, ext.segment))
            for loc in obj.replicas
        )

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
        res, ttl = self.lookup_rows(keys, lease_ttl_s, pin_ttl_s)
        return self._views(keys, res), ttl

    def lookup_rows(
        self, keys: Sequence[str], lease_ttl_s: float = 0.0, pin_ttl_s: float = 0.0,
        reader: str | None = None,
    ) -> tuple[RowBatch, float]:  # fmt: skip
        """`lookup`, answered as row ids (the service encodes replies from them);
        `reader` (not None): who is granted the leases ("" anonymous), recorded per row
        for kvstore.master.admin.ReaderBook."""
        ttl = leases.lease_ttl(self.config, lease_ttl_s)
        pin = leases.pin_ttl(self.config, pin_ttl_s)
        return lookups.lookup(self, keys, ttl, pin, reader), ttl

    def peek(self, keys: Sequence[str]) -> list[ObjectMeta | KVStoreError]:
        """COMPLETE objects of `keys` with no side effect: no lease, LRU touch or counter."""
        return self._views(keys, self.peek_rows(keys))

    def peek_rows(self, keys: Sequence[str]) -> RowBatch:
        return lookups.peek(self, keys)

    def _views(self, keys: Sequence[str], res: RowBatch) -> list[ObjectMeta | KVStoreError]:
        t = self.objects
        return [
            res.errors[j] if i < 0 else ObjectMeta(t, i, keys[j])
            for j, i in enumerate(res.ids.tolist())
        ]

    def remove(
        self, keys: Sequence[str], force: bool = False, node_id: str = "", client_id: str = "",
        own: Collection[str] = (),
    ) -> list[KeyError_]:  # fmt: skip
        """Remove committed keys; leased or pinned ones only with `force`. `node_id`:
        only their replicas on that node (Mooncake's per-segment replica clear); an
        object goes with its last replica. `client_id`: the caller, whose own writer
        leases (kvstore.master.writerleases) do not block its remove; `own`: keys whose
        read lease only the caller holds (kvstore.master.admin.removable_by_reader),
        which does not block it either (another client's writer lease still does)."""
        now = self.clock()
        return [self._remove_one(key, force, now, node_id, client_id, own) for key in keys]

    def _remove_one(
        self, key: str, force: bool, now: float, node_id: str = "", client_id: str = "",
        own: Collection[str] = (),
    ) -> KeyError_:  # fmt: skip
        obj = self.objects.get(key)
        if obj is None:
            return NotFoundError(f"unknown key {key!r}")
        if obj.state is ObjectState.WRITING:
            return NotReadyError(f"{key!r} is being written: the writer must revoke")
        there = [r for r in obj.replicas if r.node_id == node_id] if node_id else []
        if node_id and not there:
            return NotFoundError(f"{key!r} has no replica on node {node_id!r}")
        if obj.protected(now) and not force and key not in own:
            return NotReadyError(f"{key!r} is leased or pinned")
        if not force:
            refused = self.writer_leases.check_remove(key, client_id, now)
            if refused is not None:
                return refused
        if not there or len(there) == len(obj.replicas):
            self._drop(obj)
            # an explicit remove leaves no tombstone: the writer's own, or a forced one
            # (which may be served stale from a cache until its lease ends, as a forced
            # remove of a read-leased object may: kvstore.master.writerleases)
            self.writer_leases.released(key)
            return None
        if obj.moving:  # its move's source or target may be one of them: let it settle
            return NotReadyError(f"{key!r} is moving between tiers")
        for loc in there:
            self.drop_replica(obj, loc)
        return None

    # ---- background duties --------------------------------------------------

    def tick(self) -> tuple[list[str], int, int]:
        """Periodic duties: (dead nodes dropped, stale puts reclaimed, objects evicted)."""
        dead = self.expire_nodes()
        reclaimed = self.reclaim_stale_puts()
        self.extents.expire(self.clock())
        self.writer_leases.sweep(self.clock(), tombs=True)
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
        obj.replicas = sorted([*obj.replicas, loc], key=lambda r: int(r.tier))
        self.journal.save_object(obj)

    def drop_replica(self, obj: ObjectMeta, loc: Location, evicted: bool = False) -> None:
        """Drop one replica (the object goes with its last one)."""
        if len(obj.replicas) == 1:
            if evicted:
                self.evict_object(obj)
            else:
                self._drop(obj)
            return
        where = (loc.node_id, loc.segment, loc.offset)
        obj.replicas = [r for r in obj.replicas if (r.node_id, r.segment, r.offset) != where]
        seg = self.registry.segments.get((loc.node_id, loc.segment))
        if seg is not None:
            seg.release(loc.offset, loc.length)
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
        state = obj.state
        for loc in obj.replicas:
            seg = self.registry.segments.get((loc.node_id, loc.segment))
            if seg is not None:
                seg.release(loc.offset, loc.length)
                self.tiering.forget(obj.key, loc)
        self.groups.discard_id(obj.id)
        self.objects.usage.drop(obj.key, obj.size, self.objects.copies.get(obj.id, 1))
        self.objects.index.delete(obj.id)
        self.objects.free_id(obj.id)
        self.writing.pop(obj.key, None)
        if len(self.writer_leases):
            self.writer_leases.dropped(obj.key, self.clock())
        if state is ObjectState.COMPLETE or self.journaled:  # (WRITING ones are journaled)
            self.journal.drop_object(obj.key)

    # ---- integrity and restore ----------------------------------------------

    def check_integrity(self) -> None:
        """Assert every cross-index invariant (tests call this after each step)."""
        self.registry.check_integrity()
        self.objects.check_integrity()
        self.groups.check_integrity(self.objects)
        self.writer_leases.check_integrity()
        ranges: dict[tuple[str, str], list[tuple[int, int]]] = {
            k: [] for k in self.registry.segments
        }
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
                where = (loc.node_id, loc.segment)
                assert loc.length == obj.size, f"{key!r}: replica length != size"
                assert self.registry.segments[where].tier == loc.tier, f"{key!r} tier"
                ranges[where].append((loc.offset, loc.length))
                by_segment[where].add(key)
        assert len(self.writing) == sum(
            1 for i in self.objects.live_ids().tolist()
            if self.objects.state_v[i] == ObjectState.WRITING
        ), "writing index"  # fmt: skip
        for k, seg in self.registry.segments.items():
            assert seg.keys == by_segment[k], f"segment {k} key index is stale"
        for node_id, name, offset, length in self.extents.pieces():
            ranges[(node_id, name)].append((offset, length))
        for loc in self.tiering.reserved():
            where = (loc.node_id, loc.segment)
            if where in ranges:
                ranges[where].append((loc.offset, loc.length))
        for k, seg in self.registry.segments.items():
            seg.allocator.check_integrity(ranges[k])  # ranges + free ranges tile the segment
        self.tiering.check_integrity()

    def hold_all(self, lease_s: float) -> None:
        """Lease every live object for `lease_s` from now (a restarted or new master:
        readers and writers may still use what the last one let them cache, for at
        most that long). Until then removes are refused and eviction skips them."""
        if lease_s <= 0:
            return
        rows, lease = self.objects.live_ids(), self.objects.col["lease"]
        lease[rows] = np.maximum(lease[rows], self.clock() + lease_s)  # one pass

    def restore(self) -> int:
        """Reload nodes, segments, objects and extents from the journal; objects loaded.

        Restored nodes get a fresh heartbeat deadline: those that do not heartbeat
        within `node_ttl_s` are declared dead as usual. Objects still in WRITING get a
        fresh `put_timeout_s` (their writer may commit them here); the destinations of
        COPYs a node was handed stay held until it reports them (kvstore.master.tiering);
        extents get a fresh `extent_ttl_s`, each keeping the parts of its range nothing
        else holds (the newest extent first: a range an older one gave up may have gone
        to it).
        """
        snap = self.journal.load()
        now = self.clock()
        for rec in snap.nodes:
            nixl = base64.b64decode(rec.get("nixl", ""))
            endpoint = Endpoint(rec["tcp"], rec["shm"], rec["rpc"], nixl, rec.get("fd", ""))
            self.registry.register(rec["id"], endpoint, now)
        for rec in snap.segments:
            seg, _ = self.registry.mount(
                rec["node"], rec["name"], Tier(rec["tier"]), rec["capacity"], rec["alignment"],
                rec.get("shm", False),
            )  # fmt: skip
            self._attach(seg)
        for rec in snap.objects:
            self._restore_object(rec, now)
        for rec in snap.moves:  # exact ranges: before the extents take what is left
            self.tiering.restore_move(rec)
        granted = [(row, rec["client"]) for rec in snap.extents for row in rec["extents"]]
        shrunk = set()
        for row, client_id in sorted(granted, key=lambda g: -g[0][0]):  # newest first
            extent_id, node_id, name, start, length = row
            if (
                self.extents.restore(extent_id, client_id, node_id, name, start, length, now)
                is None
            ):
                shrunk.add(client_id)
        for client_id in sorted(shrunk):
            self.extents.changed(client_id)
        return len(self.objects)

    def _restore_object(self, rec: dict[str, Any], now: float) -> None:
        key, size, group = rec["key"], rec["size"], rec["group"]
        locs = [Location(n, Tier(t), s, o, ln) for n, t, s, o, ln in rec["replicas"]]
        for loc in locs:
            seg = self.registry.segment(loc.node_id, loc.segment)
            seg.allocator.allocate_at(loc.offset, loc.length)
        state = ObjectState.WRITING if rec.get("writing") else ObjectState.COMPLETE
        writer = rec.get("writer", "")
        self._new_object(key, size, group, state, locs, writer, now, rec.get("checksum", 0))
