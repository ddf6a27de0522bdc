"""An HA pool as real processes: N masters on one etcd, storage nodes given every master.

with HACluster(etcd, masters=3, nodes=2) as c:
    c.address                 # "a:1,b:2,c:3": what clients and nodes are given
    i = c.leader()            # index of the master that answers (the leader)
    c.kill_master(i)          # SIGKILL; c.start_one_master() adds a fresh one
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from kvstore import failover
from kvstore.v1 import master_pb2, master_pb2_grpc
from tests.cluster import START_TIMEOUT_S, Cluster, _read_line, child_env, stop_process
from tests.ha.etcd import Etcd


@dataclass
class HACluster(Cluster):
    etcd: Etcd | None = None
    masters: int = 3
    cluster_id: str = "pool-test"
    prefix: str = "/kvstore-test"
    ha_lease_s: int = 2
    master_procs: list[subprocess.Popen[bytes] | None] = field(default_factory=list)
    master_addresses: list[str] = field(default_factory=list)

    def master_args(self, listen: str = "127.0.0.1:0", **extra: Any) -> list[str]:
        assert self.etcd is not None
        opts = {"node_ttl_s": 5.0, "heartbeat_interval_s": 0.2, "tick_interval_s": 0.05}
        opts.update(self.master_options)
        cluster_id = extra.get("cluster_id", self.cluster_id)
        args = [sys.executable, "-m", "kvstore.master", "--listen", listen,
                "--etcd", self.etcd.endpoint, "--cluster-id", cluster_id,
                "--etcd-prefix", self.prefix, "--ha-lease-s", str(self.ha_lease_s),
                "--log-level", "INFO"]  # fmt: skip
        for name, value in opts.items():
            args += ["--set", f"{name}={value}"]
        return args

    def start_one_master(self, index: int | None = None) -> int:
        """Start a master (or restart master `index` on its old address); its index."""
        i = len(self.master_procs) if index is None else index
        listen = "127.0.0.1:0" if index is None else self.master_addresses[index]
        log = open(self.workdir / f"master{i}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            self.master_args(listen), stdout=subprocess.PIPE, stderr=log, env=child_env()
        )
        log.close()
        line = _read_line(proc, b"kvstore master listening on ", START_TIMEOUT_S)
        if index is None:
            self.master_procs.append(proc)
            self.master_addresses.append(line.split()[4].decode())
        else:
            self.master_procs[index] = proc
        return i

    def start_master(self) -> str:
        for _ in range(self.masters):
            self.start_one_master()
        self.address = ",".join(self.master_addresses)
        self.wait_leader()
        return self.address

    def stats_of(self, i: int, timeout_s: float = 2.0) -> master_pb2.StatsResponse:
        with grpc.insecure_channel(self.master_addresses[i]) as ch:
            return master_pb2_grpc.MasterStub(ch).Stats(
                master_pb2.StatsRequest(), timeout=timeout_s
            )

    def leader(self) -> int | None:
        """Index of the master that answers Stats (followers refuse), None if none does."""
        for i, proc in enumerate(self.master_procs):
            if proc is None or proc.poll() is not None:
                continue
            with contextlib.suppress(grpc.RpcError):
                self.stats_of(i, 1.0)
                return i
        return None

    def wait_leader(self, timeout_s: float = 20.0, not_: int | None = None) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            i = self.leader()
            if i is not None and i != not_:
                return i
            time.sleep(0.05)
        raise TimeoutError(f"no leader within {timeout_s} s")

    def kill_master(self, i: int, sig: signal.Signals = signal.SIGKILL) -> None:
        proc = self.master_procs[i]
        assert proc is not None
        proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
            self.master_procs[i] = None

    def stats(self, timeout_s: float = 5.0) -> master_pb2.StatsResponse:
        with failover.sync_channel(self.address, failover_s=timeout_s) as channel:
            stub = master_pb2_grpc.MasterStub(channel)
            return stub.Stats(master_pb2.StatsRequest(), timeout=timeout_s)

    def stop_master(self, sig: signal.Signals = signal.SIGTERM) -> None:
        for i, proc in enumerate(self.master_procs):
            if proc is None:
                continue
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGCONT)  # a stopped one must see its SIGTERM
            stop_process(proc)
            if proc.stdout is not None:
                proc.stdout.close()
            self.master_procs[i] = None
