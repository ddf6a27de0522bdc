"""The pool across emulated hosts (network namespaces on one bridge, see hosts.py).

Host a runs the master and a client driver, hosts b and c a storage node each, and
host c a second client driver. Every process has its namespace as KVSTORE_HOST_ID,
so between hosts "auto" must move bytes over the network: TCP, or NIXL restricted
to UCX's TCP transport when installed; never shared memory (which the namespaces
still share), while a client reading its own host's replica uses shm.
The lost-host tests (each on a pool of its own) cut b off the switch or kill its
node: reads fail over or fail typed, in bounded time, and the master declares b
dead after its node TTL and drops its replicas.
"""

from __future__ import annotations

import contextlib
import glob
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvstore.transfer.nixl import nixl_available
from tests.netns.driver import DriverClient
from tests.netns.hosts import Network, list_netns
from tests.netns.pool import NODE_TTL_S, Pool, wait_until

pytestmark = pytest.mark.netns

REMOTE = "nixl" if nixl_available() else "tcp"  # what "auto" uses between hosts


def remote(n: int) -> Counter[str]:
    return Counter({REMOTE: n})


SIZES = {"64KiB": 64 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20}
TYPED_FAILURES = {"TransferError", "NotFoundError", "UnavailableError"}
FAIL_WITHIN_S = 15.0


@dataclass
class Hosts:
    """The running pool: node ids, and the client drivers of hosts a and c."""

    net: Network
    pool: Pool
    node_b: str
    node_c: str
    on_a: DriverClient
    on_c: DriverClient
    workdir: Path

    def put(self, driver: DriverClient, key: str, size: int, replicas: int) -> bytes:
        """Store `size` fresh pseudo-random bytes under `key` through `driver`; the bytes."""
        data = random.Random(key).randbytes(size)
        path = self.workdir / f"{key}.in"
        path.write_bytes(data)
        driver.ok(op="put", key=key, path=str(path), replicas=replicas)
        return data

    def get(self, driver: DriverClient, key: str) -> tuple[dict[str, Any], bytes | None]:
        """`driver`'s get of `key`: its reply and the bytes it read (None on failure)."""
        out = self.workdir / f"{key}.{os.urandom(4).hex()}.out"
        reply = driver.call(op="get", key=key, out=str(out))
        return reply, out.read_bytes() if reply["ok"] else None

    def holders(self) -> dict[str, list[str]]:
        return dict(self.on_a.ok(op="holders")["holders"])

    def stats(self) -> dict[str, Any]:
        return dict(self.on_a.ok(op="stats")["stats"])


@contextlib.contextmanager
def running_pool(workdir: Path) -> Iterator[Hosts]:
    """Master + driver in a, a node in b (96 MiB) and in c (48 MiB), a driver in c."""
    with Network(["a", "b", "c"], workdir) as net:
        pool = Pool(net)
        try:
            pool.start_master("a")
            node_b = pool.start_node("b", dram_mib=96)  # more free space: replicas=1 lands on b
            node_c = pool.start_node("c", dram_mib=48)
            on_a, on_c = pool.start_driver("a"), pool.start_driver("c")
            pool.wait_ready()
            yield Hosts(net, pool, node_b, node_c, on_a, on_c, workdir)
        finally:
            net.close()
            for path in glob.glob(f"/dev/shm/kvs-node-*-{net.tag}-*"):  # left by killed nodes
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    with running_pool(tmp_path_factory.mktemp("netns")) as pool:
        yield pool


@pytest.fixture
def fresh_hosts(tmp_path: Path) -> Iterator[Hosts]:
    """A pool of its own, for a test that breaks it."""
    with running_pool(tmp_path) as pool:
        yield pool


def test_network_isolated_connected_partitioned_and_cleaned(tmp_path: Path) -> None:
    """Hosts reach each other, a partition drops packets, close() removes everything."""
    server_code = (
        "import socket, sys, time\n"
        "s = socket.create_server((sys.argv[1], 7000)); print('up', flush=True)\n"
        "c, _ = s.accept(); c.sendall(c.recv(4)); time.sleep(60)\n"
    )
    client_code = (
        "import socket, sys\n"
        "try:\n"
        "    c = socket.create_connection((sys.argv[1], 7000), timeout=1.0)\n"
        "    c.sendall(b'ping'); print(c.recv(4).decode(), flush=True)\n"
        "except OSError as e:\n"
        "    print(type(e).__name__, flush=True)\n"
    )
    with pytest.raises(ZeroDivisionError), Network(["x", "y"], tmp_path) as net:
        names = {net.switch, *(h.netns for h in net.hosts.values())}
        assert names <= set(list_netns())
        y = net.hosts["y"].address
        server = net.spawn("y", "server", [sys.executable, "-c", server_code, y])
        assert server.reader.readline(10.0) == b"up"
        ping = net.spawn("x", "ping", [sys.executable, "-c", client_code, y])
        assert ping.reader.readline(10.0) == b"ping"
        net.partition("y")
        cut = net.spawn("x", "cut", [sys.executable, "-c", client_code, y])
        assert cut.reader.readline(10.0) == b"TimeoutError"
        _ = 1 / 0  # a failing test: close() must still clean up
    assert not names & set(list_netns())
    assert server.popen.poll() is not None


def test_nodes_announce_their_emulated_host(hosts: Hosts) -> None:
    nodes = {n["node_id"]: n["endpoint"] for n in hosts.stats()["nodes"]}
    assert {k: v["shm_host_id"] for k, v in nodes.items()} == {
        hosts.node_b: hosts.net.hosts["b"].netns,
        hosts.node_c: hosts.net.hosts["c"].netns,
    }
    assert nodes[hosts.node_b]["tcp_address"].startswith(hosts.net.hosts["b"].address + ":")


@pytest.mark.parametrize("label", list(SIZES))
def test_exact_bytes_across_hosts_by_tcp(hosts: Hosts, label: str) -> None:
    size = SIZES[label]
    rep, only_b = f"rep-{label}", f"onb-{label}"
    sent = hosts.on_a.transfers()
    data = hosts.put(hosts.on_a, rep, size, replicas=2)
    data_b = hosts.put(hosts.on_a, only_b, size, replicas=1)
    assert hosts.on_a.transfers() - sent == remote(3)  # 2 + 1 replicas, none by shm
    holders = hosts.holders()
    assert sorted(holders[rep]) == sorted([hosts.node_b, hosts.node_c])
    assert holders[only_b] == [hosts.node_b]

    before = hosts.on_c.transfers()
    reply, got = hosts.get(hosts.on_c, only_b)  # c reads b's only replica: other host
    assert reply["ok"], reply
    assert got == data_b
    assert hosts.on_c.transfers() - before == remote(1)

    before = hosts.on_a.transfers()
    reply, got = hosts.get(hosts.on_a, rep)  # a holds no replica: TCP from b or c
    assert reply["ok"], reply
    assert got == data
    assert hosts.on_a.transfers() - before == remote(1)

    before = hosts.on_c.transfers()
    reply, got = hosts.get(hosts.on_c, rep)  # c's own host's replica: shm (same host id)
    assert reply["ok"], reply
    assert got == data
    assert hosts.on_c.transfers() - before == Counter(shm=1)


@pytest.mark.parametrize("cut", ["partition", "kill"])
def test_lost_host_fails_over_fails_typed_and_is_dropped(fresh_hosts: Hosts, cut: str) -> None:
    """b vanishes: packets silently dropped (partition) or its node SIGKILLed (refused)."""
    h = fresh_hosts
    b, c = h.node_b, h.node_c
    data = h.put(h.on_a, "part-rep", 1 << 20, replicas=2)
    h.put(h.on_a, "part-onb", 64 << 10, replicas=1)
    assert h.holders() == {"part-rep": [b, c], "part-onb": [b]}  # most free first: b
    assert (h.stats()["dead_nodes"], h.stats()["dropped_replicas"]) == (0, 0)

    if cut == "partition":
        h.net.partition("b")
    else:
        h.pool.nodes[b].popen.kill()

    sent = h.on_a.transfers()
    start = time.monotonic()
    reply, got = h.get(h.on_a, "part-rep")  # b's replica first: times out, then c's
    assert time.monotonic() - start < FAIL_WITHIN_S, reply
    assert reply["ok"], reply
    assert got == data
    assert h.on_a.transfers() - sent == remote(2)

    start = time.monotonic()
    reply, _ = h.get(h.on_c, "part-onb")  # b's only replica, b unreachable
    assert time.monotonic() - start < FAIL_WITHIN_S, reply
    assert not reply["ok"] and reply["error"] in TYPED_FAILURES, reply

    stats = wait_until(h.stats, lambda s: s["dead_nodes"] > 0, 5 * NODE_TTL_S)
    assert (stats["dead_nodes"], stats["dropped_replicas"], stats["objects"]) == (1, 2, 1)
    assert [n["node_id"] for n in stats["nodes"]] == [c]
    assert h.holders() == {"part-rep": [c]}

    reply, _ = h.get(h.on_c, "part-onb")
    assert reply["error"] == "NotFoundError", reply
    sent = h.on_a.transfers()
    reply, got = h.get(h.on_a, "part-rep")
    assert reply["ok"] and got == data, reply
    assert h.on_a.transfers() - sent == remote(1)  # b is no longer tried
