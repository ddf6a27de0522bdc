"""Real master and storage-node processes on 127.0.0.1, for tests that need a pool.

    with Cluster(nodes=2, dram_bytes=4 << 20, master_options={"put_timeout_s": 1.0}) as c:
        client = Client(c.address)                 # the master's "host:port"
        c.kill_node(0)                             # SIGKILL one node
        c.wait_stats(lambda s: s.dead_nodes == 1)  # poll the master's Stats, bounded
        c.restart_master()                         # same port, new epoch

Every process is `sys.executable -m/-c ...` with this checkout on PYTHONPATH; its
stdout/stderr go to files under `workdir` (shown in failures). Readiness is
observed through the master's Stats, with a deadline. `close()` stops nodes then
the master (SIGTERM, SIGKILL after a grace period) and removes /dev/shm segment
files a killed node left behind. The `cluster` fixture of a test module can be
built with `cluster_fixture(...)`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from kvstore.master.server import grpc_options
from kvstore.v1 import master_pb2, master_pb2_grpc

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 30.0  # a process must be up within this (2 loaded cores: imports are slow)
STOP_GRACE_S = 5.0


def child_env() -> dict[str, str]:
    """The environment of child processes: this checkout importable, unbuffered output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def stop_process(proc: subprocess.Popen[Any], grace_s: float = STOP_GRACE_S) -> int:
    """SIGTERM, then SIGKILL after `grace_s`; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(grace_s)


def _read_line(proc: subprocess.Popen[bytes], prefix: bytes, timeout_s: float) -> bytes:
    """The first stdout line of `proc` starting with `prefix`, within `timeout_s`."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(left):
                break
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            for line in buf.split(b"\n")[:-1]:
                if line.startswith(prefix):
                    return line
    raise RuntimeError(f"no {prefix!r} line from pid {proc.pid} in {timeout_s} s: {buf[-500:]!r}")


@dataclass(slots=True)
class NodeProcess:
    """One storage-node process of a cluster."""

    node_id: str
    proc: subprocess.Popen[bytes]
    log: Path
    segments: int  # how many segments it mounts

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Cluster:
    """A master and storage nodes as real processes. Use as a context manager."""

    nodes: int = 2
    dram_bytes: int = 4 << 20
    ssd_bytes: int = 0
    master_options: dict[str, float] = field(default_factory=dict)
    db_path: str | None = None
    heartbeat_s: float = 0.2
    nixl: bool = False  # nodes also serve their DRAM by NIXL (`kvstore.node --nixl`)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kvs-cluster-")))
    address: str = ""
    master: subprocess.Popen[bytes] | None = None
    node_procs: list[NodeProcess] = field(default_factory=list)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    # -- master -----------------------------------------------------------------

    def start_master(self) -> str:
        """Start the master (on `address` again after a restart); returns "host:port"."""
        listen = self.address or "127.0.0.1:0"
        opts = {"node_ttl_s": 2.0, "heartbeat_interval_s": 0.2, "tick_interval_s": 0.05}
        opts.update(self.master_options)
        args = [sys.executable, "-m", "kvstore.master", "--listen", listen]
        args += ["--db", self.db_path] if self.db_path else []
        for name, value in opts.items():
            args += ["--set", f"{name}={value}"]
        log = open(self.workdir / "master.log", "ab")  # noqa: SIM115 - the child owns it
        self.master = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, env=child_env())
        log.close()
        line = _read_line(self.master, b"kvstore master listening on ", START_TIMEOUT_S)
        self.address = line.split()[4].decode()
        return self.address

    def stop_master(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop the master (SIGKILL with `sig=signal.SIGKILL`)."""
        if self.master is not None:
            if sig == signal.SIGKILL:
                self.master.kill()
                self.master.wait(STOP_GRACE_S)
            else:
                stop_process(self.master)
            if self.master.stdout is not None:
                self.master.stdout.close()
            self.master = None

    def restart_master(self, sig: signal.Signals = signal.SIGKILL) -> str:
        """Kill the master and start a new one on the same address (a new epoch)."""
        self.stop_master(sig)
        return self.start_master()

    # -- nodes ------------------------------------------------------------------

    def ssd_dir(self, node_id: str) -> Path:
        """The SSD directory of `node_id` (one per node: a directory records its owner)."""
        return self.workdir / "ssd" / node_id

    def start_node(
        self, dram_bytes: int | None = None, wait: bool = True, node_id: str | None = None,
        extra: Sequence[str] = (),
    ) -> NodeProcess:  # fmt: skip
        """Start one more node (or restart `node_id`: same id, same SSD directory); wait
        until the master lists its segments."""
        node_id = node_id or f"n{len(self.node_procs)}-{self.tag}"
        dram = self.dram_bytes if dram_bytes is None else dram_bytes
        args = [
            sys.executable, "-m", "kvstore.node", "--master", self.address, "--node-id", node_id,
            "--dram-mib", str(dram / (1 << 20)), "--heartbeat-s", str(self.heartbeat_s),
        ]  # fmt: skip
        args += ["--nixl"] if self.nixl else []
        segments = int(dram > 0)
        if self.ssd_bytes:
            ssd_dir = self.ssd_dir(node_id)
            ssd_dir.mkdir(parents=True, exist_ok=True)
            args += ["--ssd-dir", str(ssd_dir), "--ssd-mib", str(self.ssd_bytes / (1 << 20))]
            segments += 1
        args += list(extra)
        log = self.workdir / f"{node_id}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=out, env=child_env())
        node = NodeProcess(node_id, proc, log, segments)
        self.node_procs.append(node)
        if wait:
            self.wait_node(node)
        return node

    def wait_node(self, node: NodeProcess, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until the master lists every segment of `node`."""

        def mounted(s: master_pb2.StatsResponse) -> bool:
            if not node.alive():
                raise RuntimeError(f"node {node.node_id} exited: {self.log_tail(node.log)}")
            return sum(g.node_id == node.node_id for g in s.segments) >= node.segments

        self.wait_stats(mounted, timeout_s)

    def kill_node(self, index: int) -> NodeProcess:
        """SIGKILL node `index` (its segment file stays in /dev/shm until close())."""
        node = self.node_procs[index]
        node.proc.kill()
        node.proc.wait(STOP_GRACE_S)
        return node

    def stop_node(self, index: int) -> int:
        """SIGTERM node `index` (a clean leave: unmount, unlink); its exit code."""
        return stop_process(self.node_procs[index].proc)

    # -- observation ------------------------------------------------------------

    def stats(self, timeout_s: float = 5.0) -> master_pb2.StatsResponse:
        with grpc.insecure_channel(self.address, options=grpc_options()) as channel:
            stub = master_pb2_grpc.MasterStub(channel)
            return stub.Stats(master_pb2.StatsRequest(), timeout=timeout_s)

    def holders(self, key: str) -> list[str]:
        """Node ids of `key`'s replicas, in the master's order ([] when absent)."""
        with grpc.insecure_channel(self.address, options=grpc_options()) as channel:
            stub = master_pb2_grpc.MasterStub(channel)
            page = stub.ListObjects(master_pb2.ListObjectsRequest(prefix=key), timeout=5.0)
        return [r.node_id for o in page.objects if o.key == key for r in o.replicas]

    def node_index(self, node_id: str) -> int:
        return [n.node_id for n in self.node_procs].index(node_id)

    def wait_stats(
        self,
        predicate: Callable[[master_pb2.StatsResponse], bool],
        timeout_s: float = 10.0,
        poll_s: float = 0.05,
    ) -> master_pb2.StatsResponse:
        """Poll Stats until `predicate` holds; TimeoutError (with the last Stats) after."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            with contextlib.suppress(grpc.RpcError):
                last = self.stats()
                if predicate(last):
                    return last
            time.sleep(poll_s)  # polling another process's state, not synchronising threads
        raise TimeoutError(f"condition not met within {timeout_s} s; last stats: {last}")

    @staticmethod
    def log_tail(path: Path, size: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return path.read_bytes()[-size:].decode(errors="replace")
        return ""

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> Cluster:
        self.start_master()
        for _ in range(self.nodes):
            self.start_node(wait=False)
        for node in self.node_procs:
            self.wait_node(node)
        return self

    def close(self) -> None:
        """Stop nodes, then the master; remove segment files killed nodes left."""
        for node in self.node_procs:
            stop_process(node.proc)
        self.stop_master()
        for node in self.node_procs:
            for path in glob.glob(f"/dev/shm/kvs-{node.node_id}-*"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


def cluster_fixture(scope: str = "module", **options: Any) -> Any:
    """A pytest fixture yielding a started Cluster(**options)."""

    @pytest.fixture(scope=scope)  # type: ignore[call-overload]
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
        with Cluster(workdir=tmp_path_factory.mktemp("cluster"), **options) as cluster:
            yield cluster

    return fixture
