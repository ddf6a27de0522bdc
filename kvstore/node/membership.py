"""Keeps a process's lent segments in the pool: register, mount, heartbeat, re-join.

Used by the storage node and by a client that contributes a segment. A heartbeat
answered NOT_FOUND (the master forgot us: it restarted without state or declared
us dead) or carrying a new `master_epoch` (it restarted) makes us register and
mount again; segments the master still lists for our node id that we do not own
(left by an earlier run under the same id) are unmounted, so no orphaned replica
stays visible. A master that is down is retried on the next beat.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from kvstore.errors import KVStoreError, NotFoundError, UnavailableError
from kvstore.rpc_errors import raise_from_rpc_error
from kvstore.security.capabilities import Keyring
from kvstore.types import Tier
from kvstore.v1 import common_pb2, master_pb2, master_pb2_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MountSpec:
    """One segment to mount: its name, tier, capacity in bytes, and whether it is a
    /dev/shm file same-host peers may map by name."""

    name: str
    tier: Tier
    capacity: int
    shm: bool = False
    alignment: int = 0  # 0 = the membership's (e.g. 4096 for an O_DIRECT SSD slab)


class Membership:
    """Registration and heartbeats of one node id over a sync gRPC channel."""

    def __init__(
        self,
        channel: grpc.Channel,
        node_id: str,
        endpoint: common_pb2.NodeEndpoint,
        mounts: Sequence[MountSpec],
        *,
        rpc_timeout_s: float = 5.0,
        heartbeat_s: float = 0.0,
        alignment: int = 0,
        incarnation: str = "",
        after_join: Callable[[Callable[[str, Any], Any]], None] | None = None,
        keyring: Keyring | None = None,
    ) -> None:
        self._stub = master_pb2_grpc.MasterStub(channel)
        self.node_id = node_id
        self._endpoint = endpoint
        self._mounts = tuple(mounts)
        self._timeout = rpc_timeout_s
        self._heartbeat_s = heartbeat_s
        self._alignment = alignment
        self._incarnation = incarnation
        self._after_join = after_join  # e.g. announce a durable segment's objects
        # Secured mode: the data-plane key each registration hands out, and the master's
        # capability clock each heartbeat re-anchors (kvstore.security.capabilities)
        self._keyring = keyring
        self._interval = heartbeat_s or 1.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._joined = False
        self._reachable = True
        self.epoch = ""
        self.joins = 0  # registrations done (1 after start; more after master restarts)

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self._timeout)
        except grpc.RpcError as err:
            raise_from_rpc_error(err)

    def join(self) -> None:
        """Register, drop stale segments of our id, mount ours (raises on failure)."""
        self._joined = False
        req = master_pb2.RegisterNodeRequest(
            node_id=self.node_id, endpoint=self._endpoint, incarnation=self._incarnation,
            runs_tasks=True,  # every StorageNode runs a TaskWorker beside its membership
        )  # fmt: skip
        sent = time.monotonic()
        reg = self._call("RegisterNode", req)
        if self._keyring is not None:
            if reg.capability_key:
                self._keyring.install(
                    reg.capability_key, reg.capability_key_id, reg.capability_clock_ms, sent
                )
            else:  # a master that issues no capabilities: ours can grant nothing
                self._keyring.clear()
                log.warning("master issued node %s no data-plane key", self.node_id)
        if not self._heartbeat_s and reg.heartbeat_interval_ms:
            self._interval = reg.heartbeat_interval_ms / 1000
        self._drop_stale()
        for spec in self._mounts:
            self._call(
                "MountSegment",
                master_pb2.MountSegmentRequest(
                    node_id=self.node_id, segment=spec.name, tier=int(spec.tier),
                    capacity=spec.capacity, alignment=spec.alignment or self._alignment,
                    shm=spec.shm,
                ),
            )  # fmt: skip
        if self._after_join is not None:
            self._after_join(self._call)
        self.epoch = reg.master_epoch
        self.joins += 1
        self._joined = True
        log.info("node %s joined master epoch %s", self.node_id, self.epoch)

    def _drop_stale(self) -> None:
        ours = {spec.name for spec in self._mounts}
        stats = self._call("Stats", master_pb2.StatsRequest())
        for seg in stats.segments:
            if seg.node_id == self.node_id and seg.segment not in ours:
                req = master_pb2.UnmountSegmentRequest(node_id=self.node_id, segment=seg.segment)
                with contextlib.suppress(NotFoundError):
                    self._call("UnmountSegment", req)

    def beat(self) -> bool:
        """One heartbeat; re-join when forgotten or the master restarted. True if joined."""
        joined = self._beat()
        if joined:
            self._reachable = True
        return joined

    def _beat(self) -> bool:
        try:
            if self._joined:
                sent = time.monotonic()
                resp = self._call("Heartbeat", master_pb2.HeartbeatRequest(node_id=self.node_id))
                if resp.master_epoch == self.epoch:
                    if self._keyring is not None:
                        self._keyring.anchor(resp.capability_clock_ms, sent)
                    return True
                log.warning("master epoch changed to %s: re-joining", resp.master_epoch)
            self.join()
        except NotFoundError:
            log.warning("master forgot node %s: re-joining", self.node_id)
            return self._try_join()
        except UnavailableError as exc:
            if self._reachable:  # once per outage, not once per beat
                log.warning("master unreachable: %s", exc)
            self._reachable = False
            return False
        except KVStoreError:
            log.exception("heartbeat of %s failed", self.node_id)
            self._joined = False
            return False
        return True

    def _try_join(self) -> bool:
        try:
            self.join()
        except KVStoreError as exc:
            log.warning("re-join of %s failed: %s", self.node_id, exc)
            return False
        return True

    def start(self, join_timeout_s: float = 0.0) -> None:
        """Join (retrying an unreachable master for up to `join_timeout_s`; raising if
        it refuses or stays down), then heartbeat in a daemon thread."""
        self._join_within(join_timeout_s)
        self._thread = threading.Thread(
            target=self._loop, name=f"kvstore-heartbeat-{self.node_id}", daemon=True
        )
        self._thread.start()

    def _join_within(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pause = 0.1
        while True:
            try:
                self.join()
                return
            except UnavailableError:
                if time.monotonic() + pause > deadline:
                    raise
                log.info("master %s not reachable yet: retrying", self.node_id)
            if self._stop.wait(pause):
                raise UnavailableError("stopped before joining the master")
            pause = min(2 * pause, 2.0)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.beat()

    def stop(self, unmount: bool = True) -> None:
        """Stop heartbeating; unmount our segments (best effort: the master may be down)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._timeout + self._interval)
        if not unmount:
            return
        for spec in self._mounts:
            req = master_pb2.UnmountSegmentRequest(node_id=self.node_id, segment=spec.name)
            try:
                self._call("UnmountSegment", req)
            except KVStoreError as exc:
                log.info("unmount of %s skipped: %s", spec.name, exc)
