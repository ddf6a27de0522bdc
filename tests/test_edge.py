"""kvstore.edge and kvstore.metrics on a real master: health, reflection, /metrics, bind errors."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from kvstore import edge
from kvstore.errors import BadRequestError, UnavailableError
from kvstore.master.config import MasterConfig
from kvstore.master.server import serve
from kvstore.types import Location, Tier
from kvstore.v1 import common_pb2, master_pb2, master_pb2_grpc

pytestmark = pytest.mark.timeout(60)


def _scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
        return resp.read().decode()


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of `name` whose labels include `labels`."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name} {labels} in /metrics")


async def _workload(address: str) -> None:
    async with edge.aio_channel(address) as ch:
        stub = master_pb2_grpc.MasterStub(ch)
        ep = common_pb2.NodeEndpoint(tcp_address="127.0.0.1:9")
        await stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id="n1", endpoint=ep))
        await stub.MountSegment(
            master_pb2.MountSegmentRequest(
                node_id="n1", segment="d0", tier=int(Tier.DRAM), capacity=1 << 20
            )
        )
        item = master_pb2.PutStartItem(key="k", size=1000)
        await stub.PutStart(master_pb2.PutStartRequest(client_id="c", items=[item]))
        await stub.PutEnd(master_pb2.PutEndRequest(client_id="c", keys=["k"]))
        await stub.BatchLookup(master_pb2.BatchLookupRequest(keys=["k", "absent"]))


async def _reflected_services(address: str) -> list[str]:
    async with edge.aio_channel(address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for answer in stub.ServerReflectionInfo(iter([request])):
            return sorted(s.name for s in answer.list_services_response.service)
    raise AssertionError("no reflection answer")


def test_master_serves_health_reflection_and_metrics() -> None:
    async def body() -> None:
        handle = await serve(MasterConfig(listen="127.0.0.1:0"), metrics_listen="127.0.0.1:0")
        try:
            await _workload(handle.address)
            async with edge.aio_channel(handle.address) as ch:
                check = health_pb2_grpc.HealthStub(ch).Check
                res = await check(health_pb2.HealthCheckRequest(service="kvstore.v1.Master"))
                assert res.status == health_pb2.HealthCheckResponse.SERVING
            names = await _reflected_services(handle.address)
            assert "kvstore.v1.Master" in names and "grpc.health.v1.Health" in names
            text = await asyncio.to_thread(_scrape, handle.metrics_address)
        finally:
            await handle.stop()
        seg = {"node": "n1", "tier": "DRAM", "segment": "d0"}
        assert _metric(text, "kvstore_tier_capacity_bytes", **seg) == 1 << 20
        assert _metric(text, "kvstore_tier_objects", **seg) == 1
        assert _metric(text, "kvstore_tier_hits_total", **seg) == 1
        assert _metric(text, "kvstore_tier_bytes_in_total", **seg) == 1000
        assert _metric(text, "kvstore_tier_offloads_in_total", **seg) == 0  # read with a default
        assert _metric(text, "kvstore_pool_misses_total") == 1
        assert _metric(text, "kvstore_nodes") == 1
        count = "kvstore_rpc_seconds_count"
        assert _metric(text, count, component="master", method="PutStart", code="OK") == 1
        assert _metric(text, count, component="master", method="BatchLookup") == 1

    asyncio.run(body())


def test_port_in_use_is_one_unavailable_error() -> None:
    async def body() -> None:
        first = await serve(MasterConfig(listen="127.0.0.1:0"))
        try:
            with pytest.raises(UnavailableError, match="cannot listen on"):
                await serve(MasterConfig(listen=first.address))
        finally:
            await first.stop()

    asyncio.run(body())


def test_location_round_trip_and_bad_tier() -> None:
    loc = Location("n", Tier.SSD, "s", 4096, 100)
    assert edge.from_pb_location(edge.to_pb_location(loc)) == loc
    with pytest.raises(BadRequestError, match="unknown tier 9"):
        edge.tier_from_pb(9)
    with pytest.raises(BadRequestError, match="want HOST:PORT"):
        edge.split_address("nohost")


def test_client_does_not_import_the_master_server() -> None:
    """The client's modules reach the wire through kvstore.edge only."""
    import subprocess
    import sys

    code = (
        "import sys, kvstore.client, kvstore.client.aio; "
        "print(sorted(m for m in sys.modules if m.startswith('kvstore.master')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_sync_channel_to_nowhere_fails_as_unavailable() -> None:
    with edge.sync_channel("127.0.0.1:1") as ch, pytest.raises(grpc.RpcError) as err:
        master_pb2_grpc.MasterStub(ch).Stats(master_pb2.StatsRequest(), timeout=1)
    assert isinstance(edge.rpc_error(err.value), UnavailableError)


def test_grafana_dashboard_uses_only_exported_metrics() -> None:
    """Every metric docs/grafana-kvstore.json queries is declared by a kvstore server."""
    import json
    import re
    from pathlib import Path

    doc = json.loads((Path(__file__).parents[1] / "docs" / "grafana-kvstore.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    wanted = {re.sub(r"_(bucket|count|sum)$", "", m) for e in exprs for m in
              re.findall(r"kvstore_[a-z_]+", e)}  # fmt: skip

    async def body() -> str:
        handle = await serve(MasterConfig(listen="127.0.0.1:0"), metrics_listen="127.0.0.1:0")
        try:
            return await asyncio.to_thread(_scrape, handle.metrics_address)
        finally:
            await handle.stop()

    text = asyncio.run(body())
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    declared |= {n.removesuffix("_total") for n in declared} | {f"{n}_total" for n in declared}
    assert wanted and wanted <= declared, sorted(wanted - declared)


def test_message_over_the_limit_is_too_large_not_no_space() -> None:
    """gRPC's RESOURCE_EXHAUSTED for an oversized message reads back as TooLargeError."""
    from kvstore.errors import NoSpaceError, TooLargeError

    async def body() -> None:
        handle = await serve(MasterConfig(listen="127.0.0.1:0", max_message_bytes=1 << 20))
        try:
            async with edge.aio_channel(handle.address) as ch:
                keys = [f"k{i:08d}" for i in range(200_000)]  # ~2.4 MB > the 1 MiB limit
                with pytest.raises(grpc.RpcError) as err:
                    await master_pb2_grpc.MasterStub(ch).BatchLookup(
                        master_pb2.BatchLookupRequest(keys=keys)
                    )
            exc = edge.rpc_error(err.value)
            assert isinstance(exc, TooLargeError), exc
            assert not isinstance(exc, NoSpaceError)
        finally:
            await handle.stop()

    asyncio.run(body())
