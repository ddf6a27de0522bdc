"""The pool's tier hierarchy: offload on pressure, promotion on hits, persistence.

The master decides, the nodes move the bytes (node-locally: they never pass
through the master). A move is a task the owning node long-polls for
(`NodeTasks`) and reports back:

    COPY     src -> dst, both segments of one node. Offload: a faster tier's
             replica to the next slower tier when the faster segment is past
             its high watermark. Promotion: a slower replica to a faster tier
             after `promote_after` reads. The new replica is listed only when
             the node reports the copy done (and, for a durable tier, indexed),
             so a half-written copy is never visible; the source replica of an
             offload is dropped only then, and only once no lease holds it.
    PERSIST  a put committed with a replica in a durable tier (SSD): the node
             records it in its on-disk index, checking its checksum. PutEnd
             waits for it, so a committed SSD object survives a node restart.
    FORGET   a durable replica left the pool: the node drops it from its index
             (a later restart must not announce it).

Move state per object: `ObjectMeta.moving` is the id of its COPY in flight. The
destination range stays allocated until the move ends, even if the object is
dropped meanwhile (the node may still be writing there): `Move.cancelled`.

Synchronous and deterministic like the rest of the metadata core; the service
layer turns results into futures and paces dispatch by `move_bytes_per_s`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from itertools import count
from typing import TYPE_CHECKING, Any

import numpy as np

from kvstore.errors import BadRequestError, CorruptError, KVStoreError
from kvstore.master.eviction import group_evictable
from kvstore.master.model import ObjectMeta, Segment
from kvstore.types import Location, Tier

if TYPE_CHECKING:
    from kvstore.master.metadata import MasterState

DURABLE_TIERS = frozenset({Tier.SSD})


class MoveKind(IntEnum):
    """Values equal proto TaskKind."""

    COPY = 0
    PERSIST = 1
    FORGET = 2


class Purpose(IntEnum):
    OFFLOAD = 0
    PROMOTE = 1
    PERSIST = 2
    FORGET = 3


@dataclass(slots=True)
class Move:
    """One task for one node."""

    task_id: int
    kind: MoveKind
    purpose: Purpose
    key: str
    dst: Location
    src: Location | None = None
    checksum: int = 0
    cancelled: bool = False  # the object left meanwhile: free dst when the node reports
    dst_reserved: bool = False  # dst was allocated for this move and is not yet a replica

    @property
    def node_id(self) -> str:
        return self.dst.node_id

    @property
    def nbytes(self) -> int:
        return self.dst.length if self.kind is MoveKind.COPY else 0


@dataclass(slots=True)
class MoveResult:
    """What a node reported for one task: None = done, else the error it hit."""

    task_id: int
    error: KVStoreError | None = None
    checksum: int = 0


@dataclass(slots=True)
class Tiering:
    """Moves pending per node and in flight; owned by one MasterState."""

    state: MasterState
    pending: dict[str, deque[Move]] = field(default_factory=dict)
    inflight: dict[int, Move] = field(default_factory=dict)
    deferred_drops: list[tuple[str, Location]] = field(default_factory=list)
    # node -> keys whose FORGET that node never got (it restarted or died first): a
    # re-announcement of one is refused, so a removed object does not come back.
    tombstones: dict[str, set[str]] = field(default_factory=dict)
    _fastest: dict[str, Tier] = field(default_factory=dict)  # node -> its fastest tier
    _slow: np.ndarray | None = None  # see slow_slots
    # node -> COPYs a predecessor master handed it (restored from the journal): their
    # destinations stay held until the node reports them or polls without them.
    orphans: dict[str, set[int]] = field(default_factory=dict)
    # Task ids are unique across masters, not only within one: a node keeps the results
    # it could not report and reports them to whichever master answers next, which must
    # not mistake them for its own moves. Numbered from the wall clock in microseconds
    # (a successor starts later than its predecessor numbered its tasks) and, on a
    # restore, from above every id the journal holds.
    _ids: count[int] = field(default_factory=lambda: count(time.time_ns() // 1000))

    # ---- queues ---------------------------------------------------------------

    def _enqueue(self, move: Move) -> Move:
        self.pending.setdefault(move.node_id, deque()).append(move)
        return move

    def nodes_with_pending(self) -> list[str]:
        return [n for n, q in self.pending.items() if q]

    def take(self, node_id: str, limit: int) -> list[Move]:
        """Hand up to `limit` pending moves of `node_id` to it (they are then in flight)."""
        queue = self.pending.get(node_id)
        out: list[Move] = []
        journal = self.state.journal
        while queue and len(out) < limit:
            move = queue.popleft()
            self.inflight[move.task_id] = move
            if move.dst_reserved:  # the node writes there from now on: a successor must know
                journal.save_move(move)
            out.append(move)
        return out

    def node_of(self, task_id: int) -> str | None:
        """The node a queued or in-flight move belongs to (None: no such move)."""
        move = self.inflight.get(task_id) or self._pending_move(task_id)
        return None if move is None else move.node_id

    def _all_moves(self) -> list[Move]:
        """Every move in flight or still queued."""
        return [*self.inflight.values(), *(m for q in self.pending.values() for m in q)]

    def moves_in_flight(self) -> int:
        return len(self.inflight) + sum(len(q) for q in self.pending.values())

    # ---- creating moves -------------------------------------------------------

    def persist(self, obj: ObjectMeta) -> list[int]:
        """PERSIST tasks for `obj`'s durable replicas; their ids (PutEnd waits on them)."""
        ids = []
        for loc in obj.replicas:
            if is_durable(loc.tier):
                move = Move(next(self._ids), MoveKind.PERSIST, Purpose.PERSIST, obj.key, loc)
                move.checksum = obj.checksum
                ids.append(self._enqueue(move).task_id)
        return ids

    def forget(self, key: str, loc: Location) -> None:
        """Tell a durable replica's node to drop it from its index (if the node lives)."""
        if is_durable(loc.tier) and loc.node_id in self.state.registry.nodes:
            self._enqueue(Move(next(self._ids), MoveKind.FORGET, Purpose.FORGET, key, loc))

    def _copy(self, obj: ObjectMeta, src: Location, dst_seg: Segment, purpose: Purpose) -> bool:
        """Reserve room in `dst_seg` and queue a COPY; False when it has no room."""
        offset = dst_seg.allocate(obj.size)
        if offset is None:
            return False
        dst = Location(dst_seg.node_id, dst_seg.tier, dst_seg.name, offset, obj.size)
        move = Move(next(self._ids), MoveKind.COPY, purpose, obj.key, dst, src, obj.checksum)
        move.dst_reserved = True
        obj.moving = move.task_id
        self._enqueue(move)
        return True

    # ---- offload and eviction under pressure ----------------------------------

    def rebalance(self) -> int:
        """Bring every tier past its high watermark (its segments' usage summed over the
        pool) down to its low one, coldest objects first; the objects evicted."""
        by_tier: dict[Tier, list[Segment]] = {}
        for seg in self.state.registry.live_segments():
            by_tier.setdefault(seg.tier, []).append(seg)
        evicted = 0
        for tier in sorted(by_tier):
            segs = by_tier[tier]
            high, low = self.state.config.watermarks(int(tier))
            capacity = sum(s.capacity for s in segs)
            used = sum(s.used for s in segs)
            if used > high * capacity:
                evicted += self._relieve(tier, used - self._outgoing(tier), low * capacity)
        return evicted

    def _outgoing(self, tier: Tier) -> int:
        """Bytes of offloads out of `tier` queued or in flight (freed when they finish)."""
        return sum(
            m.dst.length
            for m in self._all_moves()
            if m.purpose is Purpose.OFFLOAD and m.src is not None and m.src.tier == tier
        )

    def _relieve(self, tier: Tier, used: int, target: float) -> int:
        """Offload (or evict) the coldest evictable objects of `tier` until it is at `target`."""
        state = self.state
        evicted = 0
        now = state.clock()
        for group in state.groups.oldest(state.config.rebalance_scan):
            if used <= target:
                break
            members = state.groups.members(group)
            if not members or not group_evictable(members, state.objects, now):
                continue
            for key in sorted(members):
                for here in [r for r in state.objects[key].replicas if r.tier == tier]:
                    obj = state.objects.get(key)
                    if obj is None or obj.moving:
                        break
                    seg = state.registry.segment(here.node_id, here.segment)
                    freed, dropped = self._demote(obj, here, seg)
                    used -= freed
                    evicted += dropped
        return evicted

    def _demote(self, obj: ObjectMeta, here: Location, seg: Segment) -> tuple[int, int]:
        """Move `obj` out of `seg`: (bytes that will be freed, objects evicted)."""
        state = self.state
        slower = [r for r in obj.replicas if r.tier > seg.tier]
        if slower:  # a slower copy exists (a promoted object): drop this one, no copy
            state.drop_replica(obj, here, evicted=False)
            state.counters.offloads += 1
            return obj.size, 0
        if state.config.offload:
            for target in _slower_segments(state, seg):
                if self._copy(obj, here, target, Purpose.OFFLOAD):
                    return obj.size, 0
        if len(obj.replicas) > 1:
            state.drop_replica(obj, here, evicted=True)
            return obj.size, 0
        size = obj.size  # (read before the row is freed)
        state.evict_object(obj)
        return size, 1

    # ---- promotion on hits ----------------------------------------------------

    def segments_changed(self) -> None:
        """A segment was mounted or unmounted: forget the per-node fastest tiers."""
        self._fastest.clear()
        self._slow = None

    def slow_slots(self) -> np.ndarray | None:
        """Per segment slot: True when a hit there may count toward a promotion (its
        tier is slower than its node's fastest); None when nothing is ever promoted.
        Batched lookups call `on_hit` only for hits in such slots."""
        if not self.state.config.promote_after:
            return None
        if self._slow is None:
            segs = self.state.objects.segments
            slow = np.zeros(max(segs, default=-1) + 2, bool)  # the last: "no slot" (-1)
            for slot, seg in segs.items():
                slow[slot] = seg.tier > self._fastest_tier(seg.node_id)
            self._slow = slow
        return self._slow

    def _fastest_tier(self, node_id: str) -> Tier:
        tier = self._fastest.get(node_id)
        if tier is None:
            tiers = [s.tier for s in self.state.registry.segments_of(node_id)]
            tier = self._fastest[node_id] = min(tiers, default=Tier.HBM)
        return tier

    def on_hit(self, obj: ObjectMeta, reads: int = 1) -> None:
        """A lookup hit, or `reads` reads a client served from an SSD location it had
        cached (kvstore.master.lookups.count_cached): count reads served from a slow
        tier; promote when due (one attempt however many reads are counted at once)."""
        after = self.state.config.promote_after
        if not after or obj.moving:
            return
        first = obj.replicas[0]
        if first.tier <= self._fastest_tier(first.node_id):  # the common case: O(1)
            return
        faster = _faster_segments(self.state, first)
        if not faster:
            return
        obj.slow_hits += reads
        if obj.slow_hits < after:
            return
        if not any(self._copy(obj, first, seg, Purpose.PROMOTE) for seg in faster):
            self.state.counters.promotions_skipped += 1

    # ---- results --------------------------------------------------------------

    def complete(self, node_id: str, results: Iterable[MoveResult]) -> list[MoveResult]:
        """Apply what `node_id` reported; the results of the moves it owned."""
        applied = []
        for res in results:
            move = self.inflight.get(res.task_id)
            if move is None or move.node_id != node_id:
                continue  # unknown, or another node's: ignore
            del self.inflight[res.task_id]
            self._finish(move, res)
            applied.append(res)
        # A poll reports everything the node ran since its last one, so a predecessor's
        # COPY it did not report never reached it (or died with the reply): over.
        for task_id in self.orphans.pop(node_id, ()):
            move = self.inflight.pop(task_id, None)
            if move is not None:
                self._drop_move(move, "", "")
        return applied

    def restore_move(self, rec: dict[str, Any]) -> None:
        """A predecessor's COPY in flight (a journal record): its destination is held, as
        a cancelled move of this master's, until its node reports or polls without it."""
        self._ids = count(max(next(self._ids), rec["id"] + 1))
        state = self.state
        seg = state.registry.segments.get((rec["node"], rec["segment"]))
        dst = Location(rec["node"], Tier(rec["tier"]), rec["segment"], rec["offset"], rec["length"])
        try:
            if seg is None:
                raise BadRequestError("segment gone")
            seg.allocator.allocate_at(dst.offset, dst.length)
        except BadRequestError:  # gone, or its range is another's: that move ended
            state.journal.drop_move(rec["id"])
            return
        move = Move(rec["id"], MoveKind.COPY, Purpose.OFFLOAD, rec["key"], dst, cancelled=True)
        move.dst_reserved = True
        self.inflight[move.task_id] = move
        self.orphans.setdefault(move.node_id, set()).add(move.task_id)

    def _finish(self, move: Move, res: MoveResult) -> None:
        state = self.state
        if move.dst_reserved:
            state.journal.drop_move(move.task_id)
        obj = state.objects.get(move.key)
        if move.kind is MoveKind.FORGET:
            return
        if move.kind is MoveKind.PERSIST:
            if isinstance(res.error, CorruptError) and obj is not None:
                loc = same_replica(obj, move.dst)
                if loc is not None:
                    state.drop_corrupt(obj, loc)
            elif res.error is not None:
                state.counters.failed_moves += 1
            return
        if obj is not None and obj.moving == move.task_id:
            obj.moving = 0
        live = obj is not None and not move.cancelled and same_replica(obj, move.src) is not None
        if res.error is not None or not live:
            self._abandon(move, res)
            return
        assert obj is not None and move.src is not None
        self._adopt(obj, move)

    def _abandon(self, move: Move, res: MoveResult) -> None:
        """A COPY that failed or whose object left: free its destination."""
        state = self.state
        if res.error is not None:
            state.counters.failed_moves += 1
        if move.dst_reserved:
            seg = state.registry.segments.get((move.dst.node_id, move.dst.segment))
            if seg is not None:
                seg.release(move.dst.offset, move.dst.length)
        if res.error is None:
            self.forget(move.key, move.dst)  # the node indexed it: make it forget
        obj = state.objects.get(move.key)
        if isinstance(res.error, CorruptError) and obj is not None and move.src is not None:
            loc = same_replica(obj, move.src)
            if loc is not None:  # the source bytes failed their checksum on the node
                state.drop_corrupt(obj, loc)

    def _adopt(self, obj: ObjectMeta, move: Move) -> None:
        """The copy is done: list the new replica; an offload's source goes."""
        state = self.state
        assert move.src is not None
        state.add_replica(obj, move.dst)
        seg = state.registry.segment(move.dst.node_id, move.dst.segment)
        if move.purpose is Purpose.PROMOTE:
            seg.counters.promotions_in += 1
            state.counters.promotions += 1
            obj.slow_hits = 0
            return
        seg.counters.offloads_in += 1
        state.counters.offloads += 1
        src = same_replica(obj, move.src)
        if src is None:
            return
        if obj.protected(state.clock()):
            self.deferred_drops.append((obj.key, src))
        else:
            state.drop_replica(obj, src, evicted=False)

    def drop_deferred(self) -> None:
        """Drop offloaded sources whose lease has ended (run on every tick)."""
        now = self.state.clock()
        keep = []
        for key, loc in self.deferred_drops:
            obj = self.state.objects.get(key)
            if obj is None or same_replica(obj, loc) is None:
                continue
            if obj.protected(now) or len(obj.replicas) < 2:
                keep.append((key, loc))
                continue
            self.state.drop_replica(obj, loc, evicted=False)
        self.deferred_drops = keep

    # ---- objects and nodes leaving --------------------------------------------

    def on_drop(self, obj: ObjectMeta) -> None:
        """`obj` left the pool: its moves are cancelled (their dst freed when they end)."""
        if obj.moving:
            move = self.inflight.get(obj.moving) or self._pending_move(obj.moving)
            if move is not None:
                move.cancelled = True
            obj.moving = 0

    def _pending_move(self, task_id: int) -> Move | None:
        for queue in self.pending.values():
            for move in queue:
                if move.task_id == task_id:
                    return move
        return None

    def on_unmount(self, node_id: str, name: str) -> None:
        """A segment left: moves touching it end now (its ranges are gone with it)."""

        def touches(m: Move) -> bool:
            locs = [m.dst] if m.src is None else [m.dst, m.src]
            return any((loc.node_id, loc.segment) == (node_id, name) for loc in locs)

        for task_id in [t for t, m in self.inflight.items() if touches(m)]:
            self._drop_move(self.inflight.pop(task_id), node_id, name)
        for queue in self.pending.values():
            for move in [m for m in queue if touches(m)]:
                queue.remove(move)
                self._drop_move(move, node_id, name)

    def _drop_move(self, move: Move, node_id: str, name: str) -> None:
        if move.dst_reserved:
            self.state.journal.drop_move(move.task_id)
        obj = self.state.objects.get(move.key)
        if obj is not None and obj.moving == move.task_id:
            obj.moving = 0
        if move.dst_reserved and (move.dst.node_id, move.dst.segment) != (node_id, name):
            seg = self.state.registry.segments.get((move.dst.node_id, move.dst.segment))
            if seg is not None:
                seg.release(move.dst.offset, move.dst.length)

    def on_restart(self, node_id: str) -> None:
        """A new incarnation of `node_id`: what its predecessor had in flight is lost."""
        moves = [m for m in self.inflight.values() if m.node_id == node_id]
        moves += list(self.pending.pop(node_id, ()))
        for move in moves:
            self.inflight.pop(move.task_id, None)
            if move.kind is MoveKind.FORGET:
                self.tombstones.setdefault(node_id, set()).add(move.key)
            self._drop_move(move, "", "")

    # ---- integrity ------------------------------------------------------------

    def reserved(self) -> list[Location]:
        """Destination ranges held by moves (allocated, not replicas)."""
        return [m.dst for m in self._all_moves() if m.dst_reserved]

    def check_integrity(self) -> None:
        t = self.state.objects
        moving = {task: t.index.key_of(i) for i, task in t.moving.items()}
        moves = self._all_moves()
        live = {m.task_id for m in moves}
        for task_id, key in moving.items():
            assert task_id in live, f"{key!r} waits on move {task_id} that does not exist"
        for move in moves:
            if move.kind is MoveKind.COPY and not move.cancelled:
                obj = self.state.objects.get(move.key)
                assert obj is None or obj.moving in (0, move.task_id), f"{move.key!r} moves twice"


def same_replica(obj: ObjectMeta, loc: Location | None) -> Location | None:
    """`obj`'s replica at the same (node, segment, offset) as `loc`, if it still has one."""
    if loc is None:
        return None
    for r in obj.replicas:
        if (r.node_id, r.segment, r.offset) == (loc.node_id, loc.segment, loc.offset):
            return r
    return None


def _slower_segments(state: MasterState, seg: Segment) -> list[Segment]:
    """Segments of the same node in the next slower tiers, nearest tier then most free."""
    same = [s for s in state.registry.segments_of(seg.node_id) if s.tier > seg.tier]
    return sorted(same, key=lambda s: (int(s.tier), -s.free, s.name))


def _faster_segments(state: MasterState, loc: Location) -> list[Segment]:
    """Segments of `loc`'s node in faster tiers than `loc` (the nearest faster tier first)."""
    same = [s for s in state.registry.segments_of(loc.node_id) if s.tier < loc.tier]
    return sorted(same, key=lambda s: (-int(s.tier), -s.free, s.name))


def is_durable(tier: Tier) -> bool:
    return tier in DURABLE_TIERS


__all__ = ["DURABLE_TIERS", "Move", "MoveKind", "MoveResult", "Purpose", "Tiering"]
