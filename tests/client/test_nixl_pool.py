"""NIXL through the pool: nodes publish agent metadata via the master, clients use it.

The blob format is checked everywhere; the pool tests are skipped unless NIXL is
installed (the package's cluster nodes then serve their DRAM segments by NIXL).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from dataclasses import replace

import grpc
import numpy as np
import pytest

from kvstore.client import Client
from kvstore.client.directory import SegmentDirectory
from kvstore.errors import BadRequestError, CorruptError, NotFoundError
from kvstore.node.config import NodeConfig
from kvstore.node.node import StorageNode
from kvstore.transfer.base import TransferOp, TransferRequest
from kvstore.transfer.nixl import nixl_available, pack_meta
from kvstore.transfer.nixl_pool import pack_node_meta, segment_meta, unpack_node_meta
from kvstore.transfer.select import AutoEngine, choose_kind
from kvstore.types import Location, Tier
from kvstore.v1 import master_pb2, master_pb2_grpc
from tests.client.conftest import payload
from tests.cluster import child_env

pytestmark = pytest.mark.timeout(90)
needs_nixl = pytest.mark.skipif(not nixl_available(), reason="NIXL not installed")


def test_node_meta_roundtrip_and_segment_meta() -> None:
    blob = pack_node_meta(b"agent-md", {"seg-a": 0x1000, "seg-b": 1 << 40})
    assert unpack_node_meta(blob) == (b"agent-md", {"seg-a": 0x1000, "seg-b": 1 << 40})
    assert segment_meta(blob, "seg-b") == pack_meta(1 << 40, b"agent-md")
    assert segment_meta(blob, "seg-c") == b""  # a segment the node serves without NIXL
    assert segment_meta(b"", "seg-a") == b""
    assert segment_meta(blob[:10], "seg-a") == b""  # malformed: TCP/shm only
    with pytest.raises(BadRequestError):
        pack_node_meta(b"", {"s": 1})


@pytest.mark.parametrize(
    "blob", [b"", b"XXXX\x00\x00agent", b"KVN1\x01\x00\x05\x00ab", b"KVN1\x00\x00"]
)
def test_malformed_node_meta_rejected(blob: bytes) -> None:
    with pytest.raises(BadRequestError):
        unpack_node_meta(blob)
    with pytest.raises(BadRequestError):
        pack_node_meta(b"", {"s": 1})


@needs_nixl
def test_nodes_publish_nixl_for_dram_segments_only(cluster) -> None:
    stats = cluster.stats()
    assert all(n.endpoint.nixl_metadata for n in stats.nodes)
    directory = SegmentDirectory()
    directory.update(stats)
    tiers = {(g.node_id, g.segment): Tier(g.tier) for g in stats.segments}
    assert Tier.SSD in tiers.values()
    for (node_id, segment), tier in tiers.items():
        desc = directory.descriptor(Location(node_id, tier, segment, 0, 1))
        assert desc is not None
        assert bool(desc.nixl_meta) == (tier == Tier.DRAM), (segment, tier)


@needs_nixl
def test_client_stats_carry_nixl_metadata_as_base64(cluster, client) -> None:
    stats = client.stats()
    json.dumps(stats)  # still plain data
    want = {
        n.node_id: base64.b64encode(n.endpoint.nixl_metadata).decode()
        for n in cluster.stats().nodes
    }
    assert {n["node_id"]: n["endpoint"]["nixl_metadata"] for n in stats["nodes"]} == want


@needs_nixl
def test_put_get_exact_bytes_over_nixl(cluster, fresh) -> None:
    sizes = [1, 4095, 300_001, 2 << 20]
    items = [(fresh(f"v{i}"), payload(n, seed=i)) for i, n in enumerate(sizes)]
    with Client(cluster.address, transport="nixl", timeout_s=20.0) as nixl:
        assert nixl.batch_put(items, tier=Tier.DRAM) == [None] * len(items)
        assert nixl.batch_get([k for k, _ in items]) == [v for _, v in items]
        out = np.zeros(3 << 20, dtype=np.uint8)
        assert nixl.get_into(items[-1][0], out) == sizes[-1]
        assert out[: sizes[-1]].tobytes() == items[-1][1] and not out[sizes[-1] :].any()
        nixl.check_integrity()
    with Client(cluster.address, transport="tcp") as tcp:  # what NIXL wrote, TCP reads
        assert tcp.batch_get([k for k, _ in items]) == [v for _, v in items]
        key, value = fresh("tcp"), payload(100_000, seed=9)
        tcp.put(key, value, tier=Tier.DRAM)
    with Client(cluster.address, transport="nixl", timeout_s=20.0) as nixl:
        assert nixl.get(key) == value


def _location(cluster, key: str) -> Location:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(cluster.address) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        page = stub.ListObjects(master_pb2.ListObjectsRequest(prefix=key), timeout=5.0)
    (loc,) = [r for o in page.objects if o.key == key for r in o.replicas]
    return Location(loc.node_id, Tier(loc.tier), loc.segment, loc.offset, loc.length)


@needs_nixl
def test_auto_picks_nixl_for_a_segment_on_another_host(cluster, fresh) -> None:
    key, value = fresh(), payload(1 << 16, seed=5)
    with Client(cluster.address, transport="tcp") as tcp:
        tcp.put(key, value, tier=Tier.DRAM)
        loc = _location(cluster, key)
        directory = SegmentDirectory()
        directory.update(cluster.stats())
        desc = directory.descriptor(loc)
        assert desc is not None and desc.nixl_meta
        remote = replace(desc, host_id="another-host")  # as a client elsewhere sees it
        assert choose_kind(remote) == "nixl"
        back = np.zeros(len(value), dtype=np.uint8)
        new = np.frombuffer(payload(len(value), seed=6), dtype=np.uint8).copy()
        with AutoEngine() as engine:
            dst, src = engine.register("dst", back), engine.register("src", new)
            read = TransferRequest(TransferOp.READ, remote, loc.offset, loc.length, dst, 0)
            assert engine.submit([read]).wait(20) == [None]
            write = TransferRequest(TransferOp.WRITE, remote, loc.offset, loc.length, src, 0)
            assert engine.submit([write]).wait(20) == [None]  # in place, same length
            assert set(engine._engines) == {"nixl"}
        assert back.tobytes() == value
        # The raw WRITE bypassed the put path: its bytes fail the object's checksum and are
        # never served; the reader reports the replica, which the master drops.
        with pytest.raises(CorruptError):
            tcp.get(key)
        assert cluster.stats().corrupt_replicas >= 1
        with pytest.raises(NotFoundError):
            tcp.get(key)


@needs_nixl
@pytest.mark.parametrize("nixl", [False, True])
def test_node_nixl_flag(cluster, nixl: bool) -> None:
    config = NodeConfig(master=cluster.address, dram_bytes=1 << 20, heartbeat_s=0.2, nixl=nixl)
    with StorageNode(config) as node:
        assert bool(node.nixl_metadata) == nixl and (node.nixl is not None) == nixl
        (ep,) = [n.endpoint for n in cluster.stats().nodes if n.node_id == config.node_id]
        assert ep.nixl_metadata == node.nixl_metadata
        if nixl:
            _, bases = unpack_node_meta(ep.nixl_metadata)
            assert list(bases) == [node.segments[0].name]
    assert node.nixl is None


@needs_nixl
def test_ucx_logs_go_to_stderr_and_the_process_exits_cleanly() -> None:
    """UCX's C logs default to stdout (node and driver processes speak on stdout), and
    UCX's EFA module once made every process with an agent die of SIGSEGV at exit."""
    code = "from kvstore.transfer.nixl import NixlEngine\nNixlEngine().close()\nprint('ok')\n"
    env = {k: v for k, v in child_env().items() if k not in ("UCX_LOG_FILE", "UCX_MODULES")}
    env["UCX_LOG_LEVEL"] = "info"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, b"ok\n"), done.stderr[-2000:]
    assert b"UCX" in done.stderr
