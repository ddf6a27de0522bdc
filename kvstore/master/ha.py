"""Master HA: several master processes, one leader elected on etcd, metadata replicated.

    ha = HAMaster(MasterConfig(listen="127.0.0.1:0"), HAConfig(("127.0.0.1:2379",), "pool-a"))
    await ha.start()       # etcd reached (retried with backoff), cluster id checked, serving
    ha.address, ha.role    # "follower" until it wins the leader key, then "leader"
    await ha.stop()        # a leader resigns: its successor takes over within a poll

Every master serves the Master gRPC service; only the leader runs it (`_LeaderOnly`):
a follower, or a leader past its lease, answers UNAVAILABLE "not leader: leader is
HOST:PORT" before doing anything (kvstore.errors.NotLeaderError; kvstore.failover
follows it). The leader's MasterState journals into a `ReplicatedJournal`: records
buffered in memory, written to etcd in batches (group commit) by one flusher, each txn
fenced by the leader's epoch (kvstore.master.coord). A call is answered only once
every record written up to its answer is durable in etcd, so what a client saw
committed survives the leader's death; a new leader loads the records and restores
MasterState from them (MasterState.restore), and nodes re-join it when they see the
epoch change (kvstore.node.membership).

Each leader term runs the security guard of a single master (kvstore.security.guard)
on its restored state, and honours the read leases of the term before it: the longest
lease granted is a journal record, and a new leader leases every restored object that
long (`hold_restored`), so a reader's cached location stays valid across a failover.

Fencing: the leader renews its lease every ttl/4 and stops serving `margin` before the
lease could have expired in etcd (measured from the send of the last renewal that
etcd answered); a write that still reaches etcd under an old epoch is refused there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from kvstore import edge
from kvstore.errors import KVStoreError, NotLeaderError, UnavailableError
from kvstore.fastlane import FastLaneServer
from kvstore.master.config import MasterConfig
from kvstore.master.coord import Coordinator, DeposedError, EtcdCoordinator, HAConfig, LeaderInfo
from kvstore.master.extents import Extent
from kvstore.master.journal import (
    Snapshot,
    extents_key,
    extents_record,
    move_key,
    move_record,
    node_key,
    node_record,
    object_key,
    object_record,
    segment_key,
    segment_record,
    snapshot_of,
)
from kvstore.master.metadata import MasterState
from kvstore.master.model import NodeInfo, ObjectMeta, Segment
from kvstore.master.service import MasterServicer
from kvstore.master.tiering import Move
from kvstore.security import config as security_config
from kvstore.security.guard import MasterGuard
from kvstore.v1 import master_pb2_grpc

log = logging.getLogger("kvstore.master")
SERVICE_NAME = "kvstore.v1.Master"
# Calls that show committed state: answered only once nothing they could show is pending.
READS = frozenset({"BatchLookup", "MatchPrefix", "ListObjects", "Stats", "Inspect"})
# The longest read lease any leader of the pool granted, a journal record of its own
# (not one of kvstore.master.journal's n/ s/ o/ kinds): read leases live in the leader's
# memory, so a new leader holds every restored object that long (see `_lead`).
LEASE_RECORD = b"h/lease"


def lease_horizon(records: list[tuple[bytes, bytes]]) -> float:
    """The LEASE_RECORD's seconds among loaded `records` (0.0 when absent)."""
    for key, value in records:
        if bytes(key) == LEASE_RECORD:
            return float(json.loads(bytes(value))["lease_s"])
    return 0.0


def not_leader(leader: str, why: str) -> str:
    """The wire message of a refusal (kvstore.errors.NotLeaderError.parse reads it)."""
    return f"{NotLeaderError.PREFIX}: leader is {leader or 'unknown'} ({why})"


def unknown(method: str, exc: Exception) -> str:
    """The message of a write whose outcome is unknown. It goes out as DEADLINE_EXCEEDED,
    which kvstore.failover does not retry: a refusal (UNAVAILABLE) would be, and a retry
    of a write that did land answers wrong (a Remove False, a PutEnd ExistsError)."""
    return f"outcome unknown: {method} ran, but leadership ended before it was durable ({exc})"


# ---- the journal ------------------------------------------------------------------


class ReplicatedJournal:
    """A MetaJournal whose records go to the coordinator in fenced batches.

    Writes are O(1) in memory (the last record of a key wins); `run()` flushes what is
    pending as one batch of txns, then the next; `sync()` waits until every record
    written so far is durable. After a DeposedError (or `fail`) every waiter gets the
    error: that leader is done.
    """

    def __init__(self, coord: Coordinator, epoch: int, snapshot: Snapshot, ha: HAConfig) -> None:
        self._coord = coord
        self.epoch = epoch
        self._snapshot = snapshot
        self._ha = ha
        self._pending: dict[bytes, bytes | None] = {}
        self.seq = 0  # records written
        self.durable = 0  # records durable in the coordinator
        self.batches = 0
        self.failed: KVStoreError | None = None
        self._wake = asyncio.Event()
        self._flushed = asyncio.Event()

    # -- MetaJournal --------------------------------------------------------------
    def save_node(self, node: NodeInfo) -> None:
        self._put(node_key(node.node_id), node_record(node))

    def drop_node(self, node_id: str) -> None:
        self._put(node_key(node_id), None)

    def save_segment(self, seg: Segment) -> None:
        self._put(segment_key(seg.node_id, seg.name), segment_record(seg))

    def drop_segment(self, node_id: str, name: str) -> None:
        self._put(segment_key(node_id, name), None)

    def save_object(self, obj: ObjectMeta) -> None:
        self._put(object_key(obj.key), object_record(obj))

    def drop_object(self, key: str) -> None:
        self._put(object_key(key), None)

    def save_extents(self, client_id: str, extents: Sequence[Extent]) -> None:
        self._put(extents_key(client_id), extents_record(client_id, extents))

    def save_move(self, move: Move) -> None:
        self._put(move_key(move.task_id), move_record(move))

    def drop_move(self, task_id: int) -> None:
        self._put(move_key(task_id), None)

    def load(self) -> Snapshot:
        return self._snapshot

    def save_lease_horizon(self, lease_s: float) -> None:
        self._put(LEASE_RECORD, json.dumps({"lease_s": lease_s}).encode())

    def close(self) -> None:
        self.fail(NotLeaderError(not_leader("", "journal closed")))

    # -- group commit -------------------------------------------------------------
    def _put(self, key: bytes, value: bytes | None) -> None:
        self._pending[key] = value
        self.seq += 1
        self._wake.set()

    def fail(self, exc: KVStoreError) -> None:
        if self.failed is None:
            self.failed = exc
            self._notify()

    def _notify(self) -> None:
        done, self._flushed = self._flushed, asyncio.Event()
        done.set()

    async def sync(self, seq: int | None = None) -> None:
        """Return once records up to `seq` (default: all so far) are durable."""
        target = self.seq if seq is None else seq
        while self.durable < target:
            if self.failed is not None:
                raise self.failed
            await self._flushed.wait()

    async def run(self) -> None:
        """Flush batches until failed (a deposed epoch) or cancelled."""
        pause, warned = 0.05, False
        while self.failed is None:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, self._pending = self._pending, {}
            upto = self.seq
            try:
                await self._write(list(batch.items()))
            except DeposedError as exc:
                self.fail(exc)
                return
            except UnavailableError as exc:  # retry; the lease decides when to give up
                if not warned:
                    log.warning("event=journal_retry epoch=%d error=%s", self.epoch, exc)
                warned = True
                batch.update(self._pending)  # records written meanwhile are newer
                self._pending = batch
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.5)
                continue
            pause, warned = 0.05, False
            self.durable = upto
            self.batches += 1
            self._notify()

    async def _write(self, ops: list[tuple[bytes, bytes | None]]) -> None:
        gate = asyncio.Semaphore(self._ha.txns_in_flight)

        async def one(chunk: list[tuple[bytes, bytes | None]]) -> None:
            async with gate:
                await self._coord.commit(self.epoch, chunk)

        chunks = chunked(ops, self._ha.max_txn_ops, self._ha.max_txn_bytes)
        results = await asyncio.gather(*(one(c) for c in chunks), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for err in errors:  # a refusal wins over an outage: it is final
            if isinstance(err, DeposedError):
                raise err
        if errors:
            raise errors[0]


def chunked(
    ops: list[tuple[bytes, bytes | None]], max_ops: int, max_bytes: int
) -> list[list[tuple[bytes, bytes | None]]]:
    """`ops` in order, cut into txns of at most `max_ops` ops and about `max_bytes`."""
    out: list[list[tuple[bytes, bytes | None]]] = [[]]
    size = 0
    for op in ops:
        n = len(op[0]) + len(op[1] or b"") + 16
        if out[-1] and (len(out[-1]) >= max_ops or size + n > max_bytes):
            out.append([])
            size = 0
        out[-1].append(op)
        size += n
    return out if out[0] else []


# ---- the gRPC face ----------------------------------------------------------------


class _LeaderOnly:
    """Stands in for MasterServicer at registration: every RPC name forwards to
    `HAMaster.handle`, which runs it on the leader's servicer or refuses it."""

    def __init__(self, ha: HAMaster) -> None:
        self._ha = ha

    def __getattr__(self, method: str) -> Callable[[Any, Any], Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        handle = self._ha.handle

        async def forward(request: Any, context: grpc.aio.ServicerContext) -> Any:
            return await handle(method, request, context)

        return forward


# ---- the master -------------------------------------------------------------------


class HAMaster:
    """One master process of an HA pool: follower, candidate, leader, and back."""

    def __init__(
        self, config: MasterConfig, ha: HAConfig, coord: Coordinator | None = None,
        on_role: Callable[[str, int], None] | None = None,
    ) -> None:  # fmt: skip
        self.config = config
        self.ha = ha
        self.coord: Coordinator = coord or EtcdCoordinator(ha.etcd, ha.prefix, ha.rpc_timeout_s)
        self.id = f"master-{uuid.uuid4().hex[:12]}"
        self.on_role = on_role  # called with ("leader", epoch) / ("follower", 0)
        self.margin = min(0.5, 0.15 * ha.lease_ttl_s)
        self.address = ""
        self.edge: edge.EdgeServer | None = None
        self.leader_hint = ""  # the leader's address as last seen
        self.epoch = 0
        self.terms = 0  # times this process became leader
        self.state: MasterState | None = None
        self.servicer: MasterServicer | None = None
        self.guard: MasterGuard | None = None  # the leader's limits, authz and quotas
        self.journal: ReplicatedJournal | None = None
        self.valid_until = 0.0  # time.monotonic() until which the leader may answer
        self._leader_tasks: list[asyncio.Task[Any]] = []
        self._main: asyncio.Task[None] | None = None
        self._warned = False
        self.lane: FastLaneServer | None = None
        self.lane_address = ""
        self.granted_lease_s = 0.0  # the longest read lease granted (LEASE_RECORD)

    @property
    def role(self) -> str:
        return "leader" if self.servicer is not None else "follower"

    # -- start / stop -------------------------------------------------------------
    async def start(self, metrics_listen: str | None = None) -> HAMaster:
        await connect_with_backoff(self.coord, self.ha)
        from kvstore.metrics import MasterCollector, on_loop

        loop = asyncio.get_running_loop()
        collector = MasterCollector(lambda: on_loop(loop, self._stats))
        self.edge = await edge.start_server(
            self.config.listen,
            lambda s: master_pb2_grpc.add_MasterServicer_to_server(_LeaderOnly(self), s),
            [SERVICE_NAME], metrics_listen=metrics_listen, collectors=[collector],
            component="master", max_message_bytes=self.config.max_message_bytes,
        )  # fmt: skip
        self.address = self.ha.advertise or self.edge.address
        if self.config.fast_lane and security_config.from_env().insecure:
            # The hot-path calls, framed (kvstore.fastlane); every one goes through
            # `handle`, so followers refuse them as they refuse gRPC ones. Plaintext: only
            # where the gRPC port is plaintext too (as a single master).
            self.lane = await FastLaneServer.start(
                _LeaderOnly(self), edge.split_address(self.edge.address)[0]
            )
            port = self.lane.address.rsplit(":", 1)[1]
            self.lane_address = f"{edge.split_address(self.address)[0]}:{port}"
        self._main = asyncio.create_task(self._run())
        log.info(
            "event=master_started role=follower address=%s cluster=%s etcd=%s prefix=%s",
            self.address, self.ha.cluster_id, self.coord.endpoint, self.ha.prefix,
        )  # fmt: skip
        return self

    def _stats(self) -> tuple[Any, float]:
        from kvstore.master import queries

        if self.state is None:
            raise NotLeaderError(not_leader(self.leader_hint, "no metrics on a follower"))
        return queries.stats(self.state), self.state.clock()

    async def stop(self, grace_s: float = 0.5) -> None:
        """Stop serving; a leader resigns (revokes its lease) so a follower takes over."""
        if self._main is not None:
            self._main.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._main
        if self.lane is not None:
            await self.lane.stop()
        if self.edge is not None:
            await self.edge.stop(grace_s)
        await self.coord.close()

    # -- serving ------------------------------------------------------------------
    def serving(self) -> MasterServicer | None:
        """The servicer while this master leads and its lease holds, else None."""
        if self.servicer is None or time.monotonic() >= self.valid_until:
            return None
        return self.servicer

    def _refusal(self) -> str:
        hint = "" if self.leader_hint == self.address else self.leader_hint
        return not_leader(hint, f"{self.address} is a follower")

    async def handle(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Run one Master RPC on the leader's servicer; refuse it (having done nothing)
        on a follower. A call that wrote records is answered once they are durable (and,
        the flush being in order, all before them); a read (READS) waits for whatever
        is pending, so it never shows a commit that a failover could still undo."""
        servicer, journal, guard = self.serving(), self.journal, self.guard
        if servicer is None or journal is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self._refusal())
            raise AssertionError("unreachable")  # abort raises
        before = journal.seq
        behavior = getattr(servicer, method)
        if guard is None:
            reply = await behavior(request, context)
        else:  # as a single master's interceptor: limits, authz, quotas (a refusal aborts)
            reply = await guard.call(method, behavior, request, context)
        granted = _lease_granted(method, reply)
        if granted > self.granted_lease_s * 1000:
            # durable before the lease is answered, so a successor honours it
            self.granted_lease_s = granted / 1000
            journal.save_lease_horizon(self.granted_lease_s)
        wrote = journal.seq > before
        if wrote or (method in READS and journal.durable < journal.seq):
            try:
                await journal.sync()
            except KVStoreError as exc:
                if wrote:  # it ran, and its records may still land in etcd: no refusal
                    await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, unknown(method, exc))
                await context.abort(grpc.StatusCode.UNAVAILABLE, not_leader("", str(exc)))
        if not wrote and self.serving() is not servicer:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self._refusal())
        return reply  # a durable write is committed, whatever this master is by now

    # -- roles --------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            try:
                info = await self.coord.leader()
                if info is None:
                    await self._campaign()
                else:
                    await self._follow(info)
                self._warned = False
            except UnavailableError as exc:
                if not self._warned:
                    log.warning(
                        "event=etcd_unreachable endpoint=%s error=%s", self.coord.endpoint, exc
                    )
                self._warned = True
            await asyncio.sleep(self.ha.poll_s)

    async def _follow(self, info: LeaderInfo) -> None:
        if info.address != self.leader_hint:
            log.info("event=leader_seen leader=%s epoch=%d", info.address, info.epoch)
        self.leader_hint = info.address
        if info.id == self.id:  # our own earlier term, its lease not yet expired
            await self.coord.revoke(info.lease)

    async def _campaign(self) -> None:
        started = time.monotonic()
        lease = await self.coord.grant(self.ha.lease_ttl_s)
        epoch = await self.coord.campaign(lease, LeaderInfo.value(self.id, self.address))
        if epoch is None:
            await self.coord.revoke(lease)
            return
        self.valid_until = started + self.ha.lease_ttl_s - self.margin
        reason = "stopped"
        try:
            reason = await self._lead(lease, epoch)
        finally:
            await self._step_down(lease, reason)

    async def _lead(self, lease: int, epoch: int) -> str:
        """Restore the pool's metadata, serve it; return why leadership ended."""
        from kvstore.master.server import _tick_forever

        t0 = time.monotonic()
        records = await self.coord.load()
        horizon = lease_horizon(records)
        snapshot = snapshot_of(r for r in records if bytes(r[0]) != LEASE_RECORD)
        journal = ReplicatedJournal(self.coord, epoch, snapshot, self.ha)
        state = MasterState(self.config, journal=journal)
        restored = state.restore()
        self.granted_lease_s = horizon
        hold_restored(state, horizon)
        servicer = MasterServicer(state, str(epoch))
        servicer.fast_lane = self.lane_address  # Stats tells clients where it is
        servicer.fast_lane_local = self.lane.local if self.lane is not None else ""
        # The restored nodes run task workers that will poll this leader: until they do,
        # a PutEnd must still wait for their PERSIST (or it acknowledges an SSD replica
        # that no index holds yet).
        servicer.broker.expect_pollers(list(state.registry.nodes))
        # The guard of this term: its quota ledger is rebuilt from the restored objects.
        servicer.guard = self.guard = MasterGuard(state)
        self.state, self.journal, self.epoch = state, journal, epoch
        self._leader_tasks = [
            asyncio.create_task(journal.run()),
            asyncio.create_task(_tick_forever(servicer, self.config.tick_interval_s)),
        ]
        self.servicer = servicer  # from here on, calls are answered
        self.leader_hint = self.address
        self.terms += 1
        log.warning(
            "event=leader_elected epoch=%d address=%s restored_objects=%d restore_ms=%.0f",
            epoch, self.address, restored, (time.monotonic() - t0) * 1000,
        )  # fmt: skip
        if self.on_role is not None:
            self.on_role("leader", epoch)
        return await self._keep_lease(lease, journal)

    async def _keep_lease(self, lease: int, journal: ReplicatedJournal) -> str:
        every = self.ha.lease_ttl_s / 4
        compact_at = time.monotonic() + (self.ha.compact_every_s or float("inf"))
        while True:
            if time.monotonic() >= compact_at:
                compact_at = time.monotonic() + self.ha.compact_every_s
                self._leader_tasks = [t for t in self._leader_tasks if not t.done()]
                self._leader_tasks.append(asyncio.create_task(self._compact()))
            if journal.failed is not None:
                return f"journal refused: {journal.failed}"
            sent = time.monotonic()
            try:  # bounded by the lease left: a step-down is due at valid_until, not later
                left = await asyncio.wait_for(
                    self.coord.keepalive(lease), max(0.05, self.valid_until - sent)
                )
            except TimeoutError:
                return "lease not renewed in time: etcd did not answer"
            except UnavailableError as exc:
                if time.monotonic() >= self.valid_until:
                    return f"lease not renewed in time: {exc}"
                left = -1
            if left == 0:
                return "lease expired in etcd"
            if left > 0:
                self.valid_until = max(self.valid_until, sent + left - self.margin)
            if time.monotonic() >= self.valid_until:
                return "lease not renewed in time"
            await asyncio.sleep(max(0.0, min(every, self.valid_until - time.monotonic())))

    async def _compact(self) -> None:
        try:
            await self.coord.compact()
        except UnavailableError as exc:
            log.info("event=etcd_compact_skipped error=%s", exc)

    async def _step_down(self, lease: int, reason: str) -> None:
        was_leading = self.servicer is not None
        self.servicer = None  # refuse first
        self.valid_until = 0.0
        if self.journal is not None:
            self.journal.fail(NotLeaderError(not_leader("", f"leadership lost: {reason}")))
        for task in self._leader_tasks:
            task.cancel()
        for task in self._leader_tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._leader_tasks = []
        self.state = self.journal = self.guard = None
        self.leader_hint = ""
        if was_leading:
            log.warning("event=leader_stepped_down epoch=%d reason=%s", self.epoch, reason)
            if self.on_role is not None:
                self.on_role("follower", 0)
        with contextlib.suppress(Exception):  # resign: a successor need not wait the TTL
            await asyncio.wait_for(self.coord.revoke(lease), self.ha.rpc_timeout_s)


def _lease_granted(method: str, reply: Any) -> int:
    """Milliseconds of read lease a reply grants: a lookup's, or a commit's writer lease
    (kvstore.master.writerleases), which a successor must honour the same way."""
    if method == "BatchLookup":
        return int(reply.lease_ttl_ms)
    if method in ("CommitExtent", "PutEnd"):
        return int(reply.read_lease_ms)
    return 0


def hold_restored(state: MasterState, lease_s: float) -> None:
    """Lease every restored object for `lease_s` from now: the read leases of the last
    leader died with it, and a reader may still use what one of them let it cache
    (kvstore.client.locations); it began before this term, so it ends within `lease_s`
    of now. Until then removes are refused (NotReadyError) and eviction skips them."""
    state.hold_all(lease_s)


async def connect_with_backoff(coord: Coordinator, ha: HAConfig) -> None:
    """Reach the coordinator and claim the cluster id, retrying an outage with backoff
    for `ha.connect_timeout_s`; then UnavailableError naming the endpoint. A cluster id
    mismatch (ExistsError) is final."""
    deadline = time.monotonic() + ha.connect_timeout_s
    pause, tries = 0.2, 0
    while True:
        tries += 1
        try:
            await coord.connect()
            await coord.claim_cluster(ha.cluster_id)
            return
        except UnavailableError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise UnavailableError(
                    f"{exc} (gave up after {tries} tries in {ha.connect_timeout_s:g} s)"
                ) from None
            log.warning(
                "event=etcd_unreachable endpoint=%s retry_in=%.1fs error=%s",
                coord.endpoint, min(pause, left), exc,
            )  # fmt: skip
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, 5.0)
