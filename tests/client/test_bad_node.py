"""Placement that survives a bad node (issue 10, point 5), with real processes: a node
that registers, heartbeats and lends a big segment but whose data plane is a black
hole must not take the pool's puts with it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import grpc
import pytest

from kvstore.client import Client
from kvstore.types import Tier
from kvstore.v1 import common_pb2, master_pb2, master_pb2_grpc
from tests.cluster import Cluster


@pytest.fixture()
def pool(tmp_path) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    with Cluster(nodes=1, dram_bytes=16 << 20, workdir=tmp_path) as c:
        yield c


@pytest.fixture()
def black_hole(pool: Cluster) -> Iterator[str]:
    """A node "hole" with a 1 GiB DRAM segment at an address that never answers."""
    hole = socket.create_server(("127.0.0.1", 0), backlog=1)  # accepts nothing, ever
    address = f"127.0.0.1:{hole.getsockname()[1]}"
    stop = threading.Event()
    with grpc.insecure_channel(pool.address) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        endpoint = common_pb2.NodeEndpoint(tcp_address=address, shm_host_id="elsewhere")
        stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id="hole", endpoint=endpoint))
        stub.MountSegment(master_pb2.MountSegmentRequest(
            node_id="hole", segment="hole-dram", tier=int(Tier.DRAM), capacity=1 << 30,
        ))  # fmt: skip

        def beat() -> None:
            while not stop.wait(0.2):
                try:
                    stub.Heartbeat(master_pb2.HeartbeatRequest(node_id="hole"), timeout=2)
                except grpc.RpcError:
                    return

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        try:
            yield "hole"
        finally:
            stop.set()
            thread.join(5)
            hole.close()


def test_puts_avoid_a_black_holed_node(pool: Cluster, black_hole: str) -> None:
    values = {f"k{i}": bytes([i]) * (64 << 10) for i in range(10)}
    with Client(pool.address, transport="tcp", timeout_s=1.0) as c:
        for key, value in values.items():
            c.put(key, value)  # the first one meets the hole, reports it, lands elsewhere
        stats = pool.stats()
        assert stats.fenced_nodes == 1
        assert all(pool.holders(k) == [pool.node_procs[0].node_id] for k in values)
        assert {k: c.get(k) for k in values} == values
        for k in values:
            assert c.remove(k)
