"""Storage node: segments, serving, joining the pool, leaving it, re-joining a master."""

from __future__ import annotations

import gc
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from kvstore.client import Client
from kvstore.errors import BadRequestError, UnavailableError
from kvstore.master.server import grpc_options
from kvstore.node import NodeConfig, StorageNode
from kvstore.node.__main__ import build_parser
from kvstore.node.segments import create_dram
from kvstore.transfer.tcp import TcpEngine
from kvstore.types import Tier
from kvstore.v1 import common_pb2, master_pb2, master_pb2_grpc
from tests.cluster import Cluster
from tests.memfd import holders, shm_files

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(nodes=0, workdir=tmp_path_factory.mktemp("master")) as c:
        yield c


def _segments(cluster: Cluster, node_id: str) -> dict[str, tuple[int, int]]:
    return {
        s.segment: (s.tier, s.capacity) for s in cluster.stats().segments if s.node_id == node_id
    }


@pytest.mark.parametrize(
    "bad",
    [
        {"master": "nohost"},
        {"node_id": ""},
        {"dram_bytes": 0},
        {"ssd_bytes": 1 << 20},  # without ssd_dir
        {"tcp_port": 70000},
        {"heartbeat_s": -1},
        {"alignment": 48},
    ],
)
def test_config_is_validated(bad) -> None:
    fields = {"master": "127.0.0.1:1", **bad}
    with pytest.raises(BadRequestError):
        NodeConfig(**fields)


def test_cli_arguments_map_to_config() -> None:
    args = build_parser().parse_args(["--master", "h:1", "--dram-mib", "2", "--ssd-mib", "0.5"])
    assert (args.master, args.dram_mib, args.ssd_mib, args.port) == ("h:1", 2.0, 0.5, 0)


def test_dram_segment_is_anonymous_and_goes_away() -> None:
    dram = create_dram("t/1", 1 << 16)
    try:
        assert (dram.tier, dram.shm, dram.size) == (Tier.DRAM, True, 1 << 16)
        assert "/" not in dram.name and dram.shm_socket.startswith("@")
        assert holders(dram.name) == [os.getpid()] and shm_files(dram.name) == []  # anonymous
    finally:
        dram.close()
    assert holders(dram.name) == []  # the kernel freed the memory
    dram.close()  # idempotent


def test_node_joins_serves_and_leaves(master: Cluster, tmp_path: Path) -> None:
    cfg = NodeConfig(
        master=master.address, node_id="inproc", dram_bytes=1 << 20, ssd_dir=str(tmp_path),
        ssd_bytes=1 << 19,
    )  # fmt: skip
    node = StorageNode(cfg)
    node.start()
    try:
        dram, ssd = node.lent()
        assert _segments(master, "inproc") == {
            dram.name: (Tier.DRAM, 1 << 20),
            ssd.name: (Tier.SSD, 1 << 19),
        }
        shm = {g.segment: g.shm for g in master.stats().segments if g.node_id == "inproc"}
        # both hand their fd to same-host peers: DRAM is mapped, the SSD slab pread/pwritten
        assert shm == {dram.name: True, ssd.name: True}
        listed = [n for n in master.stats().nodes if n.node_id == "inproc"]
        assert listed[0].endpoint.tcp_address == node.endpoint
        assert listed[0].endpoint.shm_socket == dram.shm_socket != ""
        data = np.frombuffer(os.urandom(5000), dtype=np.uint8).copy()
        back = np.zeros(5000, dtype=np.uint8)
        with TcpEngine() as engine:  # a one-sided WRITE lands in the node's slab file
            local, out = engine.register("src", data), engine.register("dst", back)
            desc = node.server.descriptor(ssd.name)
            engine.write(desc, 4096, 5000, local, timeout=5)
            with open(tmp_path / "slab.dat", "rb") as f:
                f.seek(4096)
                assert f.read(5000) == data.tobytes()
            engine.read(desc, 4096, 5000, out, timeout=5)  # and reads back through O_DIRECT
            assert back.tobytes() == data.tobytes()
            with pytest.raises(BadRequestError, match="multiple of 4096"):
                engine.write(desc, 1000, 5000, local, timeout=5)  # not a range it could own
    finally:
        node.stop()
    assert _segments(master, "inproc") == {}
    assert shm_files(dram.name) == []


def test_stale_segments_of_the_same_id_are_dropped(master: Cluster) -> None:
    with grpc.insecure_channel(master.address, options=grpc_options()) as ch:
        stub = master_pb2_grpc.MasterStub(ch)
        ep = common_pb2.NodeEndpoint(tcp_address="127.0.0.1:9", shm_host_id="x")
        stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id="again", endpoint=ep))
        stub.MountSegment(
            master_pb2.MountSegmentRequest(
                node_id="again", segment="ghost", tier=common_pb2.TIER_DRAM, capacity=4096
            )
        )
    assert "ghost" in _segments(master, "again")
    with StorageNode(NodeConfig(master=master.address, node_id="again", dram_bytes=1 << 16)) as n:
        assert list(_segments(master, "again")) == [n.lent()[0].name]


@pytest.mark.slow
def test_node_rejoins_a_restarted_master(tmp_path: Path) -> None:
    with Cluster(nodes=0, workdir=tmp_path) as cluster:
        cfg = NodeConfig(master=cluster.address, node_id="rejoin", dram_bytes=1 << 16)
        with StorageNode(cfg) as node:
            assert node.membership is not None and node.membership.joins == 1
            old_epoch = node.membership.epoch
            cluster.restart_master()  # no db: the new master knows nothing
            stats = cluster.wait_stats(lambda s: "rejoin" in [g.node_id for g in s.segments])
            assert node.membership.joins == 2
            assert node.membership.epoch == stats.master_epoch != old_epoch


@pytest.mark.slow
def test_silent_node_is_dropped_then_rejoins(tmp_path: Path) -> None:
    with Cluster(nodes=1, workdir=tmp_path) as cluster:
        node = cluster.node_procs[0]
        node.proc.send_signal(signal.SIGSTOP)  # stops heart-beating
        try:
            cluster.wait_stats(lambda s: s.dead_nodes == 1 and not s.segments)
        finally:
            node.proc.send_signal(signal.SIGCONT)
        stats = cluster.wait_stats(lambda s: [g.node_id for g in s.segments] == [node.node_id])
        assert [n.node_id for n in stats.nodes] == [node.node_id]


@pytest.mark.slow
def test_cli_node_leaves_cleanly_on_sigterm(tmp_path: Path) -> None:
    with Cluster(nodes=1, workdir=tmp_path) as cluster:
        node = cluster.node_procs[0]
        (name,) = _segments(cluster, node.node_id)
        assert holders(name) == [node.proc.pid]
        assert cluster.stop_node(0) == 0
        assert _segments(cluster, node.node_id) == {}
        assert holders(name) == [] and shm_files(name) == []


@pytest.mark.slow
def test_objects_survive_a_persistent_master_restart(tmp_path: Path) -> None:
    value = os.urandom(100_000)
    with Cluster(nodes=0, db_path=str(tmp_path / "db"), workdir=tmp_path) as cluster:
        cfg = NodeConfig(master=cluster.address, node_id="durable", dram_bytes=1 << 20)
        with StorageNode(cfg) as node, Client(cluster.address, transport="tcp") as client:
            client.put("kept", value)
            cluster.restart_master()  # SIGKILL; the new master restores from RocksDB
            assert node.membership is not None
            membership = node.membership
            cluster.wait_stats(
                lambda s: membership.joins == 2 and membership.epoch == s.master_epoch
            )
            assert client.get("kept") == value
            assert _segments(cluster, "durable") == {node.segments[0].name: (Tier.DRAM, 1 << 20)}
            client.put("after", b"restart")
            assert client.get("after") == b"restart"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_master_down_at_start_is_unavailable_and_leaves_nothing() -> None:
    cfg = NodeConfig(master=f"127.0.0.1:{_free_port()}", dram_bytes=1 << 16, join_timeout_s=0.3)
    node = StorageNode(cfg)
    start = time.monotonic()
    with pytest.raises(UnavailableError):
        node.start()
    assert time.monotonic() - start < cfg.rpc_timeout_s
    name = node.segments[0].name
    del node  # the TransferServer's views were the last users of the memory
    gc.collect()
    assert holders(name) == [] and shm_files(name) == []


@pytest.mark.slow
def test_node_waits_for_a_late_master(tmp_path: Path) -> None:
    cluster = Cluster(nodes=0, workdir=tmp_path)
    cluster.address = f"127.0.0.1:{_free_port()}"
    try:
        node = cluster.start_node(wait=False)  # retries joining (--join-timeout-s 30)
        cluster.start_master()
        cluster.wait_node(node)
    finally:
        cluster.close()
