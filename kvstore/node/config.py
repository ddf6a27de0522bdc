"""Configuration of a storage node: one frozen dataclass, validated at construction."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from kvstore.errors import BadRequestError
from kvstore.transfer.base import parse_endpoint


def default_node_id() -> str:
    """A node id unique on this host for this process: "<hostname>-<pid>"."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """What a storage node lends to the pool and how it reaches the master.

    `heartbeat_s` = 0 uses the interval the master asks for at registration.
    `ssd_dir` + `ssd_bytes` > 0 add an SSD segment: the SSD tier's O_DIRECT slab file and
    RocksDB index in that directory (kvstore.tiers.ssd_segment), restart-safe: a node
    restarted with the same id and directory re-announces what it holds.
    `hbm_bytes` > 0 lends device memory of `hbm_device` as an HBM segment.
    `nixl` True also serves the DRAM segment through a NIXL agent (RDMA-capable; the
    start fails if the agent cannot start); None does so when NIXL is installed, with a
    warning if it cannot. Off by default: NIXL's Python API runs its progress thread
    with no delay, which spins a core of an idle node (measured 0.96 core), and on hosts
    without RDMA its UCX path ran slower than kvstore's own shm and TCP (docs/nixl.md).
    """

    master: str
    node_id: str = field(default_factory=default_node_id)
    listen_host: str = "127.0.0.1"
    tcp_port: int = 0
    dram_bytes: int = 64 << 20
    ssd_dir: str | None = None
    ssd_bytes: int = 0
    heartbeat_s: float = 0.0
    rpc_timeout_s: float = 5.0
    join_timeout_s: float = 0.0  # keep retrying an unreachable master this long at start
    alignment: int = 0  # allocation alignment the master uses in our segments; 0 = its default
    credentials: object | None = None  # grpc.ChannelCredentials: secure master channel
    nixl: bool | None = False  # serve DRAM by NIXL too: True = must, None = when installed
    ssd_direct_io: bool = True  # O_DIRECT on the slab (buffered fallback where refused)
    # Same-host peers get the slab's fd and pread/pwrite their ranges themselves
    # (kvstore.transfer.file; gated like the DRAM fd in secured mode). False: TCP only.
    ssd_fd_peers: bool = True
    hbm_bytes: int = 0  # device memory lent as an HBM segment
    hbm_device: str = "cuda"  # torch device of the HBM segment ("cpu" runs the same path)
    # HA (kvstore.master.ha): every master of the pool, `master` among them; the node's
    # calls follow the leader (kvstore.failover). () = `master` alone.
    masters: tuple[str, ...] = ()
    # Secured mode: uids besides this process's (and root) whose same-host processes may
    # map the DRAM segment by fd, given a capability for it (kvstore.transfer.shm.fd_gate)
    shm_peer_uids: tuple[int, ...] = ()

    # The node's credential (kvstore.security; "" = the process's KVSTORE_SECURITY_*): it
    # fills `credentials`, and node_id when left at its default (the master requires the
    # credential's id).
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    token_file: str = ""

    def __post_init__(self) -> None:
        parse_endpoint(self.master)
        from kvstore.security.process import resolve

        resolve(self, "node_id", default_id=default_node_id())
        if not self.node_id or len(self.node_id) > 256:
            raise BadRequestError("node_id must be 1..256 characters")
        if not 0 <= self.tcp_port < 65536:
            raise BadRequestError(f"bad tcp_port {self.tcp_port}")
        if self.dram_bytes < 0 or self.ssd_bytes < 0 or self.hbm_bytes < 0:
            raise BadRequestError("dram_bytes, ssd_bytes and hbm_bytes must be >= 0")
        if self.ssd_bytes and not self.ssd_dir:
            raise BadRequestError("ssd_bytes > 0 needs ssd_dir")
        if self.dram_bytes == 0 and self.ssd_bytes == 0 and self.hbm_bytes == 0:
            raise BadRequestError("a node must lend some DRAM or SSD bytes")
        if self.heartbeat_s < 0 or self.join_timeout_s < 0 or self.rpc_timeout_s <= 0:
            raise BadRequestError("heartbeat_s, join_timeout_s must be >= 0, rpc_timeout_s > 0")
        if any(not isinstance(u, int) or u < 0 for u in self.shm_peer_uids):
            raise BadRequestError(f"shm_peer_uids must be uids >= 0, got {self.shm_peer_uids}")
        if self.alignment < 0 or self.alignment & (self.alignment - 1):
            raise BadRequestError(f"alignment must be 0 or a power of two, got {self.alignment}")
