"""The master's gRPC servicer: decode a request, call `MasterState`, encode the reply.

No policy lives here. Errors of a whole call abort with the status chosen in
`kvstore.rpc_errors`; errors of one key travel as that key's ErrorCode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import grpc
import numpy as np

from kvstore.edge import from_pb_location, to_pb_location
from kvstore.errors import BadRequestError, KVStoreError, NoSpaceError
from kvstore.master import leases, lookups, queries, wire
from kvstore.master.admin import ReaderBook, removable_by_reader
from kvstore.master.admin_rpc import AdminRpcs
from kvstore.master.batch import PREPARED, PutColumns
from kvstore.master.broker import MoveBroker
from kvstore.master.extents import PREPARED_COMMIT, commit_items
from kvstore.master.metadata import MasterState
from kvstore.master.model import Endpoint, ObjectMeta, PutItem
from kvstore.master.tiering import Move, MoveResult
from kvstore.rpc_errors import error_for, translate
from kvstore.security import capabilities
from kvstore.security import config as security_config
from kvstore.types import MAX_KEY_BYTES, Location, ObjectKey, Tier
from kvstore.v1 import common_pb2, master_pb2, master_pb2_grpc

Ctx = grpc.aio.ServicerContext
log = logging.getLogger("kvstore.master")
__all__ = ["MasterServicer", "from_pb_location", "stats_to_pb", "to_pb_location"]


class MasterServicer(AdminRpcs, master_pb2_grpc.MasterServicer):
    """Thin adapter over one `MasterState`; the epoch changes per master start."""

    # kvstore.security.guard.MasterGuard, set by whoever serves this servicer (the fast
    # lane routes its calls through it as the gRPC interceptor does); None: not guarded.
    guard: Any = None

    def __init__(self, state: MasterState, epoch: str) -> None:
        self.state = state
        self.epoch = epoch
        self.locations = wire.LocationEncoder()
        self.readers = ReaderBook(state.objects)  # who holds each read lease (own removes)
        self.broker = MoveBroker(state)  # tier moves handed to the nodes, paced
        self.fast_lane = ""  # HOST:PORT of kvstore.fastlane serving this servicer, if any
        self.fast_lane_local = ""  # unix:@NAME: the same lane on an abstract Unix socket
        # Secured mode: data-plane capabilities on every location handed out (a key per
        # node, made at RegisterNode); insecure mode issues none and pays nothing.
        secured = not security_config.from_env().insecure
        self.caps: capabilities.Issuer | None = capabilities.Issuer() if secured else None
        self.cap_cache = wire.CapabilityCache()  # READ grants of hot keys, reused per quantum

    def _check_batch(self, n: int) -> None:
        if n > self.state.config.max_batch:
            raise BadRequestError(f"batch of {n} exceeds max_batch {self.state.config.max_batch}")

    @translate
    async def RegisterNode(
        self, request: master_pb2.RegisterNodeRequest, context: Ctx
    ) -> master_pb2.RegisterNodeResponse:
        ep = request.endpoint
        self.state.register_node(request.node_id, endpoint_from_pb(ep), request.incarnation)
        if request.runs_tasks:  # its SSD puts wait for PERSIST before its first poll too
            self.broker.expect_pollers([request.node_id])
        log.info(
            "event=node_registered node=%s tcp=%s rpc=%s", request.node_id, ep.tcp_address,
            ep.rpc_address or "-",
        )  # fmt: skip
        cfg = self.state.config
        reply = master_pb2.RegisterNodeResponse(
            master_epoch=self.epoch,
            node_ttl_ms=int(cfg.node_ttl_s * 1000),
            heartbeat_interval_ms=int(cfg.heartbeat_interval_s * 1000),
        )
        if self.caps is not None:  # a new key per registration: older grants stop verifying
            key = self.caps.rotate(request.node_id)
            reply.capability_key, reply.capability_key_id = key.secret, key.key_id
            reply.capability_clock_ms = key.clock_ms
        return reply

    @translate
    async def Heartbeat(
        self, request: master_pb2.HeartbeatRequest, context: Ctx
    ) -> master_pb2.HeartbeatResponse:
        self.state.heartbeat(request.node_id)
        clock = self.caps.now_ms() if self.caps is not None else 0
        return master_pb2.HeartbeatResponse(master_epoch=self.epoch, capability_clock_ms=clock)

    @translate
    async def MountSegment(
        self, request: master_pb2.MountSegmentRequest, context: Ctx
    ) -> master_pb2.MountSegmentResponse:
        if request.tier not in Tier._value2member_map_:
            raise BadRequestError(f"unknown tier {request.tier}")
        self.state.mount_segment(
            request.node_id, request.segment, Tier(request.tier), request.capacity,
            request.alignment, request.shm,
        )  # fmt: skip
        log.info(
            "event=segment_mounted node=%s segment=%s tier=%s capacity=%d", request.node_id,
            request.segment, Tier(request.tier).name, request.capacity,
        )  # fmt: skip
        return master_pb2.MountSegmentResponse()

    @translate
    async def UnmountSegment(
        self, request: master_pb2.UnmountSegmentRequest, context: Ctx
    ) -> master_pb2.UnmountSegmentResponse:
        dropped, removed = self.state.unmount_segment(request.node_id, request.segment)
        log.info(
            "event=segment_unmounted node=%s segment=%s dropped_replicas=%d", request.node_id,
            request.segment, dropped,
        )  # fmt: skip
        if removed:
            log.info("event=objects_dropped count=%d reason=segment_unmounted", removed)
        return master_pb2.UnmountSegmentResponse(dropped_replicas=dropped, removed_objects=removed)

    @translate
    async def PutStart(
        self, request: master_pb2.PutStartRequest, context: Ctx
    ) -> master_pb2.PutStartResponse:
        self._check_batch(len(request.items))
        if not request.client_id:
            raise BadRequestError("client_id must not be empty")
        prepared = PREPARED.get()  # the guard's reading of this request, if it checked it
        cols = prepared[1] if prepared and prepared[0] is request else put_request_columns(request)
        res = self.state.put_start_columns(request.client_id, request.client_node, cols)
        self.broker.wake()  # placement may have pushed a tier past its watermark
        # Secured: WRITE capabilities until the put times out (the range may be reclaimed)
        mint = self._mint(capabilities.WRITE, self.state.config.put_timeout_s)
        payload = wire.put_start_results(self.state.objects, res, self.locations, mint)
        return master_pb2.PutStartResponse.FromString(payload)

    def _mint(self, mode: int, ttl_s: float) -> wire.Mint | None:
        """Capabilities for one reply's locations (secured mode only)."""
        return self.caps.minter(mode, ttl_s) if self.caps is not None else None

    @translate
    async def PutEnd(
        self, request: master_pb2.PutEndRequest, context: Ctx
    ) -> master_pb2.PutEndResponse:
        self._check_batch(len(request.keys))
        res, waits = self.state.put_end_durable(
            request.client_id, request.keys, list(request.checksums)
        )
        if waits:  # SSD replicas: answer once their nodes have indexed them
            timeout = self.state.config.persist_timeout_s
            errors = await asyncio.gather(
                *(self.broker.wait_persisted(ids, timeout) for ids in waits.values())
            )
            for i, err in zip(waits, errors, strict=True):
                res[i] = err
        reply = master_pb2.PutEndResponse.FromString(wire.statuses_payload(res))
        lease = self._writer_lease(request.read_lease_ms)
        if lease:  # on what committed (kvstore.master.writerleases)
            done = (k for k, err in zip(request.keys, res, strict=True) if err is None)
            self.state.writer_leases.grant(request.client_id, done, lease, self.state.clock())
            reply.read_lease_ms = int(lease * 1000)
            reply.promote_after = self.state.config.promote_after
        return reply

    def _writer_lease(self, asked_ms: int) -> float:
        """The writer lease a commit gets; none when secured (a cached read would need a
        READ capability that a commit's reply does not mint)."""
        return self.state.writer_leases.ttl(asked_ms) if self.caps is None else 0.0

    @translate
    async def PutRevoke(
        self, request: master_pb2.PutRevokeRequest, context: Ctx
    ) -> master_pb2.PutRevokeResponse:
        self._check_batch(len(request.keys))
        res = self.state.put_revoke(request.client_id, request.keys)
        return master_pb2.PutRevokeResponse.FromString(wire.statuses_payload(res))

    @translate
    async def BatchLookup(
        self, request: master_pb2.BatchLookupRequest, context: Ctx
    ) -> master_pb2.BatchLookupResponse:
        self._check_batch(len(request.keys))
        keys = list(request.keys)
        if request.cached_keys and not request.no_lease:  # reads served from cache
            self._check_batch(len(request.cached_keys))
            if len(request.cached_reads) != len(request.cached_keys):
                raise BadRequestError("BatchLookup needs one cached_reads per cached_keys")
            lookups.count_cached(
                self.state, list(request.cached_keys), request.cached_reads, request.client_id
            )
        if request.no_lease:
            found, ttl = self.state.peek_rows(keys), 0.0
        else:
            found, ttl = self.state.lookup_rows(
                keys, request.lease_ttl_ms / 1000, request.pin_ttl_ms / 1000, request.client_id
            )  # the table records who holds each lease (ReaderBook reads it)
        # READ for the lease, its end rounded down to a quantum (<= 1 s, <= a quarter of
        # the lease) so that a hot key's grant is reused; a pure query gets none
        mint = None
        if self.caps is not None:
            mint = self.caps.minter(capabilities.READ, ttl, min(1000, int(ttl * 250)))
        parts = [
            wire.lookup_results(self.state.objects, found, self.locations, mint, self.cap_cache)
        ]
        self.broker.wake()  # hits may have queued promotions
        tail = master_pb2.BatchLookupResponse(lease_ttl_ms=int(ttl * 1000))
        if not request.no_lease:
            tail.promote_after = self.state.config.promote_after
            moving = self.state.objects.moving  # row -> its tier move (few, or none)
            if moving:
                tail.moving.extend(_moving(found.ids, moving))
        parts.append(tail.SerializeToString())
        # Concatenated encodings of the fields form one message: parsing is C (upb) and lazy.
        return master_pb2.BatchLookupResponse.FromString(b"".join(parts))

    @translate
    async def MatchPrefix(
        self, request: master_pb2.MatchPrefixRequest, context: Ctx
    ) -> master_pb2.MatchPrefixResponse:
        self._check_batch(len(request.keys))
        res = queries.match_prefix(self.state, request.keys, request.by_group)
        matches = [
            master_pb2.PrefixMatch(node_id=m.node_id, tier=int(m.tier), length=m.length)
            for m in res.matches
        ]
        return master_pb2.MatchPrefixResponse(pool_length=res.pool_length, matches=matches)

    @translate
    async def Remove(
        self, request: master_pb2.RemoveRequest, context: Ctx
    ) -> master_pb2.RemoveResponse:
        self._check_batch(len(request.keys))
        own = set()
        if request.client_id and not request.force:
            own = removable_by_reader(self.state, self.readers, request.keys, request.client_id)
        # the caller's own read and writer leases do not block its own remove
        res = self.state.remove(
            request.keys, request.force, request.node_id, request.client_id, own
        )
        return master_pb2.RemoveResponse.FromString(wire.statuses_payload(res))

    @translate
    async def GrantExtent(
        self, request: master_pb2.GrantExtentRequest, context: Ctx
    ) -> master_pb2.GrantExtentResponse:
        if not request.client_id:
            raise BadRequestError("client_id must not be empty")
        return self._grant(
            request.client_id, request.client_node, request.size, request.min_size,
            request.release_extent,
        )  # fmt: skip

    def _grant(
        self, client_id: str, client_node: str, size: int, min_size: int, release: int = 0,
        after: int = 0,
    ) -> master_pb2.GrantExtentResponse:  # fmt: skip
        """Lease `client_id` an extent (MasterState.grant_extent); the reply saying so."""
        ext = self.state.grant_extent(client_id, client_node, size, min_size, release, after)
        seg = self.state.registry.segment(ext.node_id, ext.segment)
        loc = to_pb_location(Location(ext.node_id, seg.tier, ext.segment, ext.start, ext.size))
        if self.caps is not None:
            self.caps.stamp([loc], capabilities.WRITE, self.state.config.extent_ttl_s)
        self.broker.wake()  # the grant may have pushed a tier past its watermark
        return master_pb2.GrantExtentResponse(
            extent_id=ext.extent_id, location=loc, alignment=seg.alignment,
            ttl_ms=int(self.state.config.extent_ttl_s * 1000),
        )  # fmt: skip

    @translate
    async def CommitExtent(
        self, request: master_pb2.CommitExtentRequest, context: Ctx
    ) -> master_pb2.CommitExtentResponse:
        n = len(request.items)
        self._check_batch(n)
        extent_id, closing = request.extent_id, request.end_writer_leases
        if closing and not extent_id and not n:
            if not request.client_id:  # a closing client's writer leases, nothing else
                raise BadRequestError("client_id must not be empty")
            self.state.writer_leases.end_client(request.client_id)
            return master_pb2.CommitExtentResponse()
        prepared = PREPARED_COMMIT.get()  # the guard's reading of this request, if it checked it
        items = prepared[1] if prepared and prepared[0] is request else commit_items(request.items)
        # a writer lease lets the writer read its keys back with no lookup
        lease = self._writer_lease(request.read_lease_ms)
        client_id, release = request.client_id, request.release
        state = self.state
        if request.next_size:  # a bad ask refuses the call before anything is committed
            state.check_extent_size(request.next_size, request.next_min_size)
        res = state.commit_extent(client_id, extent_id, items, release, lease)
        for other in request.release_extents:
            state.release_extent(client_id, other)
        reply = master_pb2.CommitExtentResponse.FromString(wire.statuses_payload(res))
        reply.ttl_ms = int(state.config.extent_ttl_s * 1000)
        reply.read_lease_ms = int(lease * 1000)
        if closing:
            state.writer_leases.end_client(client_id)
        if self.caps is not None and not release:
            ext = state.extents.live.get(extent_id)
            if ext is not None:
                reply.capability = self.caps.grant(
                    ext.node_id, ext.segment, ext.start, ext.size, capabilities.WRITE,
                    state.config.extent_ttl_s,
                )  # fmt: skip
        if request.next_size:
            with contextlib.suppress(NoSpaceError):  # the commit stands; none to give
                reply.next.CopyFrom(self._grant(
                    client_id, request.client_node, request.next_size, request.next_min_size,
                    after=extent_id,
                ))  # fmt: skip
        return reply

    @translate
    async def ReportUnreachable(
        self, request: master_pb2.ReportUnreachableRequest, context: Ctx
    ) -> master_pb2.ReportUnreachableResponse:
        self._check_batch(len(request.node_ids))
        fenced = self.state.report_unreachable(request.node_ids)
        for node_id in fenced:
            log.warning(
                "event=node_fenced node=%s reporter=%s seconds=%.1f", node_id,
                request.client_id or "-", self.state.config.fence_s,
            )  # fmt: skip
        return master_pb2.ReportUnreachableResponse(fenced=fenced)

    @translate
    async def Stats(
        self, request: master_pb2.StatsRequest, context: Ctx
    ) -> master_pb2.StatsResponse:
        reply = stats_to_pb(self.state, self.epoch)
        reply.fast_lane = self.fast_lane
        reply.fast_lane_local = self.fast_lane_local
        reply.extents = len(self.state.extents.live)
        reply.extent_bytes = self.state.extents.reserved_bytes()
        wl = self.state.writer_leases
        wl.sweep(self.state.clock())
        reply.writer_leases = len(wl)
        reply.writer_lease_refusals = wl.refused_puts + wl.refused_removes
        reply.fenced_nodes = len(self.state.registry.fenced)
        return reply

    @translate
    async def ListObjects(
        self, request: master_pb2.ListObjectsRequest, context: Ctx
    ) -> master_pb2.ListObjectsResponse:
        page, token = queries.list_objects(
            self.state, request.page_size or 100, request.page_token, request.prefix
        )
        now = self.state.clock()
        objs = [_object_info(o, now) for o in page]
        return master_pb2.ListObjectsResponse(objects=objs, next_page_token=token)

    # ---- tiers ----------------------------------------------------------------

    @translate
    async def NodeTasks(
        self, request: master_pb2.NodeTasksRequest, context: Ctx
    ) -> master_pb2.NodeTasksResponse:
        done = [
            MoveResult(r.task_id, error_for(r.status.code, r.status.message), r.checksum)
            for r in request.done
        ]
        limit = min(request.max_tasks or 64, 1024)
        moves = await self.broker.poll(request.node_id, done, request.wait_ms / 1000, limit)
        return master_pb2.NodeTasksResponse(tasks=[_task_pb(m) for m in moves])

    @translate
    async def AnnounceObjects(
        self, request: master_pb2.AnnounceObjectsRequest, context: Ctx
    ) -> master_pb2.AnnounceObjectsResponse:
        self._check_batch(len(request.objects))
        found = [(o.key, o.offset, o.length, o.checksum) for o in request.objects]
        adopted, known, dropped, refused = self.state.announce(
            request.node_id, request.segment, found, request.complete
        )
        log.info(
            "event=objects_announced node=%s segment=%s adopted=%d known=%d dropped=%d "
            "refused=%d", request.node_id, request.segment, adopted, known, dropped,
            len(refused),
        )  # fmt: skip
        self.broker.wake()
        return master_pb2.AnnounceObjectsResponse(
            adopted=adopted, known=known, dropped=dropped, refused=refused
        )

    @translate
    async def ReportCorrupt(
        self, request: master_pb2.ReportCorruptRequest, context: Ctx
    ) -> master_pb2.ReportCorruptResponse:
        self._check_batch(len(request.keys))
        if len(request.replicas) != len(request.keys):
            raise BadRequestError("ReportCorrupt needs one replica per key")
        pairs = [
            (k, from_pb_location(r)) for k, r in zip(request.keys, request.replicas, strict=True)
        ]
        dropped = self.state.report_corrupt(pairs)
        if dropped:
            log.warning("event=corrupt_replicas_dropped count=%d", dropped)
        self.broker.wake()
        return master_pb2.ReportCorruptResponse(dropped=dropped)


def _moving(ids: np.ndarray, moving: dict[int, int]) -> list[int]:
    """Positions of `ids` (rows; -1 = a miss) that are keys of `moving`."""
    if len(ids) <= 64 or len(ids) <= len(moving):
        return [j for j, i in enumerate(ids.tolist()) if i in moving]
    rows = np.fromiter(moving, np.int64, len(moving))
    return np.nonzero(np.isin(ids, rows))[0].tolist()  # type: ignore[no-any-return]


def endpoint_from_pb(ep: common_pb2.NodeEndpoint) -> Endpoint:
    return Endpoint(ep.tcp_address, ep.shm_host_id, ep.rpc_address, ep.nixl_metadata, ep.shm_socket)


def _task_pb(move: Move) -> master_pb2.NodeTask:
    task = master_pb2.NodeTask(
        task_id=move.task_id, kind=int(move.kind), key=move.key,
        dst=to_pb_location(move.dst), checksum=move.checksum,
    )  # fmt: skip
    if move.src is not None:
        task.src.CopyFrom(to_pb_location(move.src))
    return task


def _parse_item(pb: master_pb2.PutStartItem) -> PutItem | KVStoreError:
    try:
        tier = Tier(pb.tier) if pb.HasField("tier") else None
        return PutItem(
            ObjectKey(pb.key), pb.size, pb.replicas or 1, pb.preferred_node, pb.group, tier,
            pb.pin_ttl_ms / 1000,
        )  # fmt: skip
    except KVStoreError as exc:
        return exc
    except ValueError as exc:  # Tier() of an unknown value
        return BadRequestError(f"key {pb.key!r}: {exc}")


def put_request_columns(request: master_pb2.PutStartRequest) -> PutColumns:
    """`put_columns` of a request's items, reading only key and size of each item when no
    item sets another field (the usual put: ~0.25 us an item instead of ~0.7). Whether
    one does is read off the request's size: every field present beyond key and size
    adds bytes to its encoding, so an encoding exactly as long as key and size alone
    need has none (ByteSize is one C pass, ~17 us for 1,000 items)."""
    pbs = request.items
    n = len(pbs)
    if n <= 16:
        return put_columns(pbs)
    keys = [it.key for it in pbs]
    sizes = [it.size for it in pbs]
    chars = np.fromiter(map(len, keys), np.int64, n)
    klen = chars
    if not "".join(keys).isascii():
        klen = np.fromiter((len(k.encode()) for k in keys), np.int64, n)
    size = np.fromiter(sizes, np.uint64, n)
    if not klen.all() or not size.all() or size.max() >= 1 << 63:  # odd: the long way
        return put_columns(pbs)
    body = 2 + klen + _varint_bytes(klen.astype(np.uint64)) + _varint_bytes(size)
    items = int((1 + _varint_bytes(body.astype(np.uint64)) + body).sum())
    head = sum(1 + _varint_len(len(b)) + len(b) for b in _strings(request) if b)
    if request.ByteSize() != head + items:
        return put_columns(pbs)
    cols = PutColumns(keys, sizes, [1] * n, [""] * n, [""] * n, [-1] * n, [0.0] * n)
    # PutColumns.suspects of these columns: sizes > 0, one replica, no pin or tier, no
    # empty key; only a key that may be too long is left
    for i in np.nonzero(chars * 4 > MAX_KEY_BYTES)[0].tolist():
        parsed = _parse_item(pbs[i])
        if isinstance(parsed, KVStoreError):
            cols.errors[i] = parsed
    return cols


def _strings(request: master_pb2.PutStartRequest) -> tuple[bytes, bytes]:
    return request.client_id.encode(), request.client_node.encode()


def _varint_len(x: int) -> int:
    return max(1, (x.bit_length() + 6) // 7)


def _varint_bytes(x: np.ndarray) -> np.ndarray:
    """The length of each uint64's varint encoding (1-10 bytes)."""
    out = np.ones(len(x), np.int64)
    for bits in range(7, 64, 7):
        out += x >= np.uint64(1 << bits)
    return out


def put_columns(pbs: Sequence[master_pb2.PutStartItem]) -> PutColumns:
    """A PutStart request's items as columns; items PutItem would refuse carry their error."""
    rows = [
        (it.key, it.size, it.replicas or 1, it.preferred_node, it.group,
         (it.tier if it.tier >= 0 else 99) if it.HasField("tier") else -1, it.pin_ttl_ms / 1000)
        for it in pbs
    ]  # fmt: skip
    cols = PutColumns(*map(list, zip(*rows, strict=True))) if rows else PutColumns(*[[]] * 7)
    for i in cols.suspects():
        parsed = _parse_item(pbs[i])
        if isinstance(parsed, KVStoreError):
            cols.errors[i] = parsed
    return cols


def _object_info(o: ObjectMeta, now: float) -> master_pb2.ObjectInfo:
    return master_pb2.ObjectInfo(
        key=o.key, size=o.size, state=int(o.state), group=o.group,
        replicas=[to_pb_location(loc) for loc in o.replicas],
        lease_ms_left=leases.ms_left(o.lease_until, now),
        pin_ms_left=leases.ms_left(o.pin_until, now), checksum=o.checksum,
        slow_hits=o.slow_hits,
    )  # fmt: skip


def stats_to_pb(state: MasterState, epoch: str) -> master_pb2.StatsResponse:
    s = queries.stats(state)
    now = state.clock()
    nodes = [
        master_pb2.NodeStats(
            node_id=n.node_id,
            endpoint=common_pb2.NodeEndpoint(
                tcp_address=n.endpoint.tcp_address, shm_host_id=n.endpoint.shm_host_id,
                rpc_address=n.endpoint.rpc_address, nixl_metadata=n.endpoint.nixl_metadata,
                shm_socket=n.endpoint.shm_socket,
            ),
            ms_since_heartbeat=max(0, int((now - n.last_heartbeat) * 1000)),
        )
        for n in s.nodes
    ]  # fmt: skip
    segs = [
        master_pb2.SegmentStats(
            node_id=g.node_id, segment=g.name, tier=int(g.tier), capacity=g.capacity,
            used=g.used, replicas=g.replicas, hits=g.counters.hits,
            evictions=g.counters.evictions, bytes_in=g.counters.bytes_in,
            bytes_out=g.counters.bytes_out, objects=g.objects, shm=g.shm,
            offloads_in=g.counters.offloads_in, promotions_in=g.counters.promotions_in,
            corrupt=g.counters.corrupt,
            high_watermark_bytes=int(state.config.watermarks(int(g.tier))[0] * g.capacity),
        )
        for g in s.segments
    ]  # fmt: skip
    c = s.counters
    return master_pb2.StatsResponse(
        nodes=nodes, segments=segs, objects=s.objects, writing=s.writing,
        capacity=s.capacity, used=s.used, hits=c.hits, misses=c.misses,
        evictions=c.evictions, reclaimed_puts=c.reclaimed_puts, dead_nodes=c.dead_nodes,
        dropped_replicas=c.dropped_replicas, master_epoch=epoch,
        complete=s.objects - s.writing, offloads=c.offloads, promotions=c.promotions,
        promotions_skipped=c.promotions_skipped, corrupt_replicas=c.corrupt_replicas,
        moves_in_flight=state.tiering.moves_in_flight(), adopted=c.adopted,
        failed_moves=c.failed_moves,
    )  # fmt: skip
