"""The storage node: lends DRAM (and optionally SSD) segments to the pool and serves
one-sided READ/WRITE into them over TCP; same-host peers map the DRAM segment, and
when NIXL is installed a NIXL agent serves it too (metadata published via the master).

    node = StorageNode(NodeConfig(master="127.0.0.1:50051", dram_bytes=1 << 30))
    node.start()          # segments, TransferServer, RegisterNode + MountSegment, heartbeats
    node.stop()           # unmount, stop serving, unlink the segment files
    run_node(config)      # blocking, for the CLI: serves until SIGTERM/SIGINT
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import uuid
from collections.abc import Callable
from types import FrameType
from typing import Any

import grpc

from kvstore import failover
from kvstore.edge import sync_channel
from kvstore.errors import BadRequestError, KVStoreError, TransferError
from kvstore.node.config import NodeConfig
from kvstore.node.membership import Membership, MountSpec
from kvstore.node.segments import LocalSegment, create_dram
from kvstore.node.tasks import TaskWorker
from kvstore.security.capabilities import Keyring
from kvstore.security.credentials import data_plane_server, revoked_check
from kvstore.security.process import security_of
from kvstore.tiers.hbm_segment import HbmSegment
from kvstore.tiers.shm import FdServer, process_fd_server, reclaim_stale_files
from kvstore.tiers.ssd_segment import SsdSegment
from kvstore.transfer.base import local_host_id
from kvstore.transfer.nixl import NixlEngine, nixl_available
from kvstore.transfer.nixl_pool import expose_all
from kvstore.transfer.shm import fd_gate
from kvstore.transfer.tcp_server import ServerConfig, TransferServer
from kvstore.types import Tier
from kvstore.v1 import common_pb2, master_pb2

log = logging.getLogger(__name__)


def master_channel(
    master: str, credentials: object | None = None, masters: tuple[str, ...] = ()
) -> grpc.Channel:
    """A sync channel to the master (secure with `credentials`, else insecure); with
    `masters` (HA), one that follows the leader among them (kvstore.failover)."""
    if masters:
        return failover.sync_channel([master, *masters], credentials)
    return sync_channel(master, credentials)


class StorageNode:
    """Segments + TransferServer + Membership of one node id. Not restartable."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.segments: list[LocalSegment] = []  # DRAM, served as memory
        self.ssd: SsdSegment | None = None  # the SSD tier's slab + index (restart-safe)
        self.hbm: HbmSegment | None = None  # device memory (cpu device without a GPU)
        self.incarnation = uuid.uuid4().hex  # this process's life: the master's moves key
        self.worker: TaskWorker | None = None
        # Secured (the node has a credential): capabilities checked on every READ/WRITE,
        # its DRAM fds only for a capability of an allowed uid, TLS with an mTLS credential.
        self.keyring: Keyring | None = None
        self.fd_server: FdServer | None = None
        tls, revoked = None, None
        if config.credentials is not None:
            self.keyring = Keyring(config.node_id)
            self.fd_server = FdServer(authorize=fd_gate(self.keyring, config.shm_peer_uids))
            sec = security_of(config)
            tls = data_plane_server(sec)
            revoked = revoked_check(sec.revoked_file) if tls and sec.revoked_file else None
        self.server = TransferServer(
            ServerConfig(host=config.listen_host, port=config.tcp_port), tls=tls,
            keyring=self.keyring, revoked=revoked,
        )  # fmt: skip
        self._channel: grpc.Channel | None = None
        self.membership: Membership | None = None
        self.nixl: NixlEngine | None = None
        self.nixl_metadata = b""  # NodeEndpoint.nixl_metadata; b"" = not served by NIXL

    @property
    def endpoint(self) -> str:
        """ "host:port" of the TCP transfer endpoint once started."""
        return self.server.endpoint

    def start(self) -> None:
        """Create and serve the segments, then join the pool (raises if the master refuses)."""
        try:
            self._create_segments()
            self.server.start()
            for seg in self.segments:
                self.server.expose(seg.name, seg.buffer, shm=seg.shm)
            self._expose_tiers()
            self._serve_nixl()
            self._join()
        except BaseException:
            self.stop(unmount=False)
            raise

    def _create_segments(self) -> None:
        cfg = self.config
        reclaim_stale_files(cfg.node_id)  # /dev/shm files an old-design run of this id left
        if self.fd_server is not None and not self.fd_server.running:
            self.fd_server.start()
        if cfg.dram_bytes:
            self.segments.append(create_dram(cfg.node_id, cfg.dram_bytes, self.fd_server))
        if cfg.ssd_bytes and cfg.ssd_dir:
            self.ssd = SsdSegment(
                cfg.ssd_dir, cfg.ssd_bytes, cfg.node_id, direct_io=cfg.ssd_direct_io
            )
            survivors = self.ssd.recover()
            log.info(
                "node %s: SSD segment %s (%s I/O) reopened with %d objects, %d dropped",
                cfg.node_id, self.ssd.name, self.ssd.io_mode, len(survivors),
                self.ssd.dropped_at_open,
            )  # fmt: skip
        if cfg.hbm_bytes:
            name = f"kvs-{cfg.node_id.replace('/', '_')[:160]}-hbm-{self.incarnation[:8]}"
            self.hbm = HbmSegment(name, cfg.hbm_bytes, cfg.hbm_device)

    def _expose_tiers(self) -> None:
        """SSD (and device HBM) segments are served through staging over TCP; the SSD
        slab's fd also goes to same-host peers (`ssd_fd_peers`)."""
        if self.ssd is not None:
            self.server.expose_store(self.ssd.name, self.ssd)
            if self.config.ssd_fd_peers:
                self.ssd.serve(self.fd_server or process_fd_server())
        if self.hbm is not None:
            host = self.hbm.buffer
            if host is not None:
                self.server.expose(self.hbm.name, host)
            else:
                self.server.expose_store(self.hbm.name, self.hbm)

    def lent(self) -> list[LocalSegment | SsdSegment | HbmSegment]:
        """Every segment this node lends, fastest tier first."""
        out: list[LocalSegment | SsdSegment | HbmSegment] = list(self.segments)
        if self.hbm is not None:
            out.insert(0, self.hbm)
        if self.ssd is not None:
            out.append(self.ssd)
        return out

    def _serve_nixl(self) -> None:
        """Expose the DRAM segments through a NIXL agent (see NodeConfig.nixl)."""
        want = self.config.nixl
        dram = [(s.name, s.buffer) for s in self.segments if s.tier == Tier.DRAM]
        if want and self.keyring is not None:
            raise BadRequestError("a secured node cannot serve NIXL: it checks no capability")
        if want is False or not dram or self.keyring is not None:
            return
        if want is None and not nixl_available():
            return
        try:
            self.nixl = NixlEngine()
            self.nixl_metadata = expose_all(self.nixl, dram)
        except Exception as e:  # NIXL raises its own exception types
            self._close_nixl()
            if want and isinstance(e, KVStoreError):
                raise
            if want:
                raise TransferError(f"NIXL agent did not start: {e}") from e
            log.warning("NIXL agent did not start, serving TCP/shm only: %s", e)

    def _close_nixl(self) -> None:
        if self.nixl is not None:
            self.nixl.close()
            self.nixl = None
        self.nixl_metadata = b""

    def _join(self) -> None:
        cfg = self.config
        self._channel = master_channel(cfg.master, cfg.credentials, cfg.masters)
        endpoint = common_pb2.NodeEndpoint(
            tcp_address=self.endpoint, shm_host_id=local_host_id(),
            nixl_metadata=self.nixl_metadata,
            shm_socket=self._fd_socket(),
        )  # fmt: skip
        mounts = [MountSpec(s.name, s.tier, s.size, s.shm) for s in self.segments]
        if self.hbm is not None:
            mounts.insert(0, MountSpec(self.hbm.name, Tier.HBM, self.hbm.size))
        if self.ssd is not None:
            spec = MountSpec(
                self.ssd.name, Tier.SSD, self.ssd.size, shm=self.ssd.served,
                alignment=self.ssd.alignment,
            )  # fmt: skip
            mounts.append(spec)
        self.membership = Membership(
            self._channel, cfg.node_id, endpoint, mounts, rpc_timeout_s=cfg.rpc_timeout_s,
            heartbeat_s=cfg.heartbeat_s, alignment=cfg.alignment,
            incarnation=self.incarnation, after_join=self._announce, keyring=self.keyring,
        )  # fmt: skip
        self.membership.start(cfg.join_timeout_s)
        self.worker = TaskWorker(self._channel, cfg.node_id, self.lent(), cfg.rpc_timeout_s)
        self.worker.start()

    def _fd_socket(self) -> str:
        """The fd server of the segments same-host peers reach by fd ("" = none)."""
        dram = next((s.shm_socket for s in self.segments if s.shm_socket), "")
        return dram or (self.ssd.fd_socket if self.ssd is not None else "")

    def _announce(self, call: Callable[[str, Any], Any]) -> None:
        """After each join: list what the SSD index holds; forget what the master refuses."""
        if self.ssd is None:
            return
        objects = [
            master_pb2.AnnouncedObject(key=k, offset=e.offset, length=e.length, checksum=e.checksum)
            for k, e in sorted(self.ssd.indexed().items())
        ]
        reply = call(
            "AnnounceObjects",
            master_pb2.AnnounceObjectsRequest(
                node_id=self.config.node_id, segment=self.ssd.name, objects=objects,
                complete=True,
            ),
        )  # fmt: skip
        entries = self.ssd.indexed()
        for key in reply.refused:
            if key in entries:
                self.ssd.forget(key, entries[key].offset)
        log.info(
            "node %s announced %d SSD objects: %d adopted, %d known, %d refused",
            self.config.node_id, len(objects), reply.adopted, reply.known, len(reply.refused),
        )  # fmt: skip

    def stop(self, unmount: bool = True) -> None:
        """Leave the pool (unmount when asked and reachable), stop serving, free segments."""
        if self.worker is not None:  # first: no FORGET may run while we unmount
            self.worker.stop()
        if self.membership is not None:
            self.membership.stop(unmount=unmount)
        if self._channel is not None:
            self._channel.close()
        self.server.stop()
        self._close_nixl()  # deregister before the memory is unmapped
        for seg in self.lent():
            seg.close()
        if self.fd_server is not None:
            self.fd_server.stop()

    def __enter__(self) -> StorageNode:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_node(config: NodeConfig, ready: threading.Event | None = None) -> None:
    """Run a node until SIGTERM or SIGINT (main thread only); prints one ready line."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    node = StorageNode(config)
    try:
        node.start()  # on failure it has stopped itself: stopping it again would call a
    except BaseException:  # closed channel ("Cannot invoke RPC on closed channel")
        _restore(previous)
        raise
    try:
        names = ",".join(s.name for s in node.lent())
        line = f"kvstore node {config.node_id} ready on {node.endpoint} segments {names}"
        print(line, flush=True)
        if ready is not None:
            ready.set()
        stop.wait()
    finally:
        node.stop()
        _restore(previous)


def _restore(previous: dict[signal.Signals, object]) -> None:
    for sig, handler in previous.items():
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(sig, handler)  # type: ignore[arg-type]
