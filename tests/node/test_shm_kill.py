"""Processes that lend DRAM and die by SIGKILL leave nothing on the host, and
same-host clients reach a node's DRAM by fd (memfd + SCM_RIGHTS), not by a file.

"Nothing left" is checked exactly: no process holds an fd or a mapping of the
segment's memfd (tests.memfd.holders: the kernel frees a memfd at that point),
and /dev/shm has no file of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kvstore.client import Client
from kvstore.types import Tier
from kvstore.v1 import master_pb2
from tests.cluster import REPO, Cluster, child_env, stop_process
from tests.memfd import holders, shm_files

pytestmark = pytest.mark.timeout(120)
MiB = 1 << 20


@pytest.fixture
def cluster(tmp_path) -> Iterator[Cluster]:
    with Cluster(nodes=0, workdir=tmp_path) as c:
        yield c


def _dram_segments(stats: master_pb2.StatsResponse, node_id: str) -> list[str]:
    return [s.segment for s in stats.segments if s.node_id == node_id and s.tier == Tier.DRAM]


def _endpoint(stats: master_pb2.StatsResponse, node_id: str):
    return next(n.endpoint for n in stats.nodes if n.node_id == node_id)


def test_same_host_client_maps_node_dram_by_fd_then_a_killed_node_leaves_nothing(
    cluster: Cluster,
) -> None:
    node = cluster.start_node(dram_bytes=8 * MiB)
    stats = cluster.stats()
    (name,) = _dram_segments(stats, node.node_id)
    sock = _endpoint(stats, node.node_id).shm_socket
    assert sock.startswith("@") and holders(name) == [node.proc.pid]
    assert shm_files(f"kvs-{node.node_id}") == []  # no file: nothing for a crash to leak
    value = os.urandom(3 * MiB + 17)
    with Client(cluster.address, transport="shm") as client:
        client.put("k", value)  # a one-sided WRITE into the node's mapped memory
        out = bytearray(len(value))
        assert client.get_into("k", out) == len(value) and out == value
        assert client.get("k") == value
        # The client now maps the node's memfd (received over the abstract socket).
        assert sorted(holders(name)) == sorted([node.proc.pid, os.getpid()])
    assert holders(name) == [node.proc.pid]  # the client's close unmapped it
    cluster.kill_node(0)
    assert holders(name) == [] and shm_files(f"kvs-{node.node_id}") == []


LENDER = """
import sys
from kvstore.client import Client
c = Client(sys.argv[1], segment_bytes=8 << 20)
c.put(sys.argv[2], bytes(range(256)) * 4096)
print("ready", c.config.client_id, flush=True)
sys.stdin.read()  # never closed: the parent SIGKILLs us
"""

MOONCAKE = """
import sys
from kvstore.compat.mooncake import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup("127.0.0.1", "P2PHANDSHAKE", 8 << 20, 16 << 20, "tcp", "", sys.argv[1]) == 0
assert s.put(sys.argv[2], bytes(range(256)) * 4096) == 0
print("ready", flush=True)
sys.stdin.read()  # never closed: the parent SIGKILLs us
"""


@pytest.mark.parametrize("script", [LENDER, MOONCAKE], ids=["client", "mooncake"])
def test_a_lending_client_killed_without_close_leaves_nothing(
    cluster: Cluster, script: str
) -> None:
    before = {s.node_id for s in cluster.stats().segments}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, cluster.address, "lent"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env(), cwd=REPO,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(b"ready"), line
        stats = cluster.stats()
        (lender,) = {s.node_id for s in stats.segments} - before
        (name,) = _dram_segments(stats, lender)
        assert holders(name) == [proc.pid]
        with Client(cluster.address, transport="shm") as reader:  # another process maps it
            assert reader.get("lent") == bytes(range(256)) * 4096
        proc.kill()
        proc.wait(30)
        assert holders(name) == [] and shm_files(f"kvs-{lender}") == []
    finally:
        stop_process(proc)
