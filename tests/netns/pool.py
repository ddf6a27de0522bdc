"""A kvstore pool spread over emulated hosts: master, storage nodes and client drivers.

    pool = Pool(net)
    pool.start_master("a")
    b = pool.start_node("b", dram_mib=96)
    client = pool.start_driver("a")            # a DriverClient in host a
    pool.wait_ready()                          # every process up, within START_TIMEOUT_S

Every role listens on its host's address (the master on a fixed port: its namespace
is fresh, so the port is free) and all of them start at once; nodes retry joining
until the master is up. Readiness is each process's own stdout line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from kvstore.transfer.nixl import nixl_available
from tests.netns.driver import READY_LINE, DriverClient
from tests.netns.hosts import Network, Proc

MASTER_PORT = 50051
START_TIMEOUT_S = 45.0  # all processes import kvstore at once on 2 loaded cores
NODE_TTL_S = 5.0  # > 2 client timeouts: b is still listed while reads to it time out
MASTER_OPTIONS = {"node_ttl_s": NODE_TTL_S, "heartbeat_interval_s": 0.2, "tick_interval_s": 0.05}
CLIENT_TIMEOUT_S = 2.0  # every RPC and transfer of a driver's client


class Pool:
    """The processes of one pool over `net`; `net.close()` stops them."""

    def __init__(self, net: Network) -> None:
        self.net = net
        self.master_address = ""
        self.nodes: dict[str, Proc] = {}  # node id -> process
        self._pending: list[tuple[Proc, bytes]] = []  # (process, its ready-line prefix)

    def start_master(self, host: str) -> str:
        self.master_address = f"{self.net.hosts[host].address}:{MASTER_PORT}"
        code = (
            "from kvstore.master.server import run_master\n"
            f"run_master({self.master_address!r}, None, **{MASTER_OPTIONS!r})\n"
        )
        proc = self.net.spawn(host, "master", [sys.executable, "-c", code])
        self._pending.append((proc, b"kvstore master listening on "))
        return self.master_address

    def start_node(self, host: str, dram_mib: int) -> str:
        """A storage node in `host` lending `dram_mib` of DRAM; its node id."""
        node_id = f"node-{host}-{self.net.tag}"
        args = [
            sys.executable, "-m", "kvstore.node", "--master", self.master_address,
            "--node-id", node_id, "--host", self.net.hosts[host].address,
            "--dram-mib", str(dram_mib), "--heartbeat-s", "0.2", "--join-timeout-s", "30",
        ]  # fmt: skip
        args += ["--nixl"] if nixl_available() else []  # between hosts auto then uses NIXL
        proc = self.net.spawn(host, node_id, args)
        self.nodes[node_id] = proc
        self._pending.append((proc, b"kvstore node "))
        return node_id

    def start_driver(self, host: str) -> DriverClient:
        args = [
            sys.executable, "-m", "tests.netns.driver", "--master", self.master_address,
            "--timeout-s", str(CLIENT_TIMEOUT_S),
        ]  # fmt: skip
        proc = self.net.spawn(host, f"driver-{host}", args, stdin=True)
        self._pending.append((proc, READY_LINE))
        return DriverClient(proc.popen, proc.reader)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait for each started process's ready line (one shared deadline)."""
        deadline = time.monotonic() + timeout_s
        for proc, prefix in self._pending:
            try:
                proc.reader.wait_for(prefix, max(0.1, deadline - time.monotonic()))
            except (TimeoutError, EOFError) as exc:
                raise RuntimeError(f"{proc.name} not ready: {exc}\n{proc.log_tail()}") from exc
        self._pending.clear()


def wait_until(
    probe: Callable[[], Any], done: Callable[[Any], bool], timeout_s: float, poll_s: float = 0.1
) -> Any:
    """Poll `probe()` (another process's state) until `done(value)`; TimeoutError after."""
    deadline = time.monotonic() + timeout_s
    value = probe()
    while not done(value):
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done within {timeout_s} s; last value {value!r}")
        time.sleep(poll_s)  # polling a remote process's state, not synchronising threads
        value = probe()
    return value
