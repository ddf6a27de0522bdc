"""A real grpc.aio master on 127.0.0.1 and a real channel: RPCs and status mapping."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvstore import errors, rpc_errors
from kvstore.master.config import MasterConfig
from kvstore.master.server import grpc_options, serve
from kvstore.v1 import common_pb2, master_pb2, master_pb2_grpc, regen

pytestmark = pytest.mark.timeout(60)


def run(coro_fn, **config: float):  # type: ignore[no-untyped-def]
    """Run an async test body against a fresh master (no pytest-asyncio needed)."""

    def wrapper() -> None:
        async def body() -> None:
            cfg = MasterConfig(listen="127.0.0.1:0", tick_interval_s=0.05, **config)
            handle = await serve(cfg)
            try:
                async with grpc.aio.insecure_channel(handle.address) as ch:
                    await coro_fn(master_pb2_grpc.MasterStub(ch), ch, handle)
            finally:
                await handle.stop(0)

        asyncio.run(body())

    wrapper.__name__ = coro_fn.__name__
    return wrapper


async def _setup(stub: master_pb2_grpc.MasterStub) -> master_pb2.RegisterNodeResponse:
    ep = common_pb2.NodeEndpoint(tcp_address="127.0.0.1:7000", shm_host_id="h")
    reg = await stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id="n1", endpoint=ep))
    assert reg.master_epoch
    await stub.MountSegment(
        master_pb2.MountSegmentRequest(
            node_id="n1", segment="s", tier=common_pb2.TIER_DRAM, capacity=1 << 20
        )
    )
    return reg


@run
async def test_put_lookup_roundtrip(stub, ch, handle) -> None:  # type: ignore[no-untyped-def]
    reg = await _setup(stub)
    assert (reg.node_ttl_ms, reg.master_epoch) == (10_000, handle.epoch)
    items = [master_pb2.PutStartItem(key=f"k{i}", size=1000) for i in range(3)]
    items.append(master_pb2.PutStartItem(key="", size=10))
    res = await stub.PutStart(master_pb2.PutStartRequest(client_id="c", items=items))
    codes = [r.status.code for r in res.results]
    assert codes == [0, 0, 0, common_pb2.ERROR_CODE_INVALID_ARGUMENT]
    assert [r.locations[0].offset for r in res.results[:3]] == [0, 1024, 2048]
    dup = await stub.PutStart(master_pb2.PutStartRequest(client_id="d", items=items[:1]))
    assert dup.results[0].status.code == common_pb2.ERROR_CODE_ALREADY_EXISTS
    keys = ["k0", "k1", "k2"]
    end = await stub.PutEnd(master_pb2.PutEndRequest(client_id="c", keys=keys))
    assert [s.code for s in end.results] == [0, 0, 0]
    look = await stub.BatchLookup(master_pb2.BatchLookupRequest(keys=["k1", "zz"]))
    assert look.results[0].replicas[0].offset == 1024 and look.lease_ttl_ms == 5000
    assert look.results[1].status.code == common_pb2.ERROR_CODE_NOT_FOUND
    err = rpc_errors.error_for(look.results[1].status.code, look.results[1].status.message)
    assert isinstance(err, errors.NotFoundError)
    m = await stub.MatchPrefix(master_pb2.MatchPrefixRequest(keys=["k0", "k1", "x"]))
    assert m.pool_length == 2 and [(x.node_id, x.length) for x in m.matches] == [("n1", 2)]
    page = await stub.ListObjects(master_pb2.ListObjectsRequest(page_size=2))
    assert [o.key for o in page.objects] == ["k0", "k1"] and page.next_page_token == "k1"
    stats = await stub.Stats(master_pb2.StatsRequest())
    assert (stats.objects, stats.used, stats.hits, stats.misses) == (3, 3072, 1, 1)
    health = health_pb2_grpc.HealthStub(ch)
    h = await health.Check(health_pb2.HealthCheckRequest(service="kvstore.v1.Master"))
    assert h.status == health_pb2.HealthCheckResponse.SERVING
    handle.state.check_integrity()


@run
async def test_whole_call_errors_map_to_status(stub, ch, handle) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Heartbeat(master_pb2.HeartbeatRequest(node_id="ghost"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(errors.NotFoundError):
        rpc_errors.raise_from_rpc_error(info.value)
    await _setup(stub)
    bad = master_pb2.MountSegmentRequest(node_id="n1", segment="t", tier=1, capacity=3)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.MountSegment(bad)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    other = master_pb2.MountSegmentRequest(node_id="n1", segment="s", tier=1, capacity=1 << 21)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.MountSegment(other)
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(errors.ExistsError):
        rpc_errors.raise_from_rpc_error(info.value)


async def _silent_node(stub, ch, handle) -> None:  # type: ignore[no-untyped-def]
    await _setup(stub)
    items = [master_pb2.PutStartItem(key="k", size=10)]
    await stub.PutStart(master_pb2.PutStartRequest(client_id="c", items=items))
    deadline = time.monotonic() + 5
    while handle.state.registry.nodes and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not handle.state.registry.nodes and not handle.state.objects
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Heartbeat(master_pb2.HeartbeatRequest(node_id="n1"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


test_silent_node_is_dropped_by_the_ticker = run(
    _silent_node, node_ttl_s=0.3, heartbeat_interval_s=0.1
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_master_down_is_unavailable_within_deadline() -> None:
    async def body() -> None:
        addr = f"127.0.0.1:{_free_port()}"
        async with grpc.aio.insecure_channel(addr) as ch:
            stub = master_pb2_grpc.MasterStub(ch)
            start = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Stats(master_pb2.StatsRequest(), timeout=2.0)
            assert time.monotonic() - start < 3.0
            with pytest.raises(errors.UnavailableError):
                rpc_errors.raise_from_rpc_error(info.value)

    asyncio.run(body())


def test_status_mapping_both_ways() -> None:
    for cls in errors.ALL_ERRORS:
        exc = cls("x")
        status = rpc_errors.status_for(exc)
        assert status.name == cls.grpc_code
        assert isinstance(rpc_errors.error_for(rpc_errors.code_for(exc), "x"), cls)
        assert isinstance(rpc_errors.error_for_status(status, "x"), errors.KVStoreError)
    assert rpc_errors.status_for(RuntimeError()) == grpc.StatusCode.INTERNAL
    assert rpc_errors.code_for(None) == common_pb2.ERROR_CODE_OK


def test_stubs_are_fresh() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvstore.v1.regen", "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_stale_stub_is_detected(tmp_path: Path) -> None:
    for path in regen.STUB_DIR.iterdir():
        if path.name.endswith(regen.STUB_SUFFIXES):
            (tmp_path / path.name).write_bytes(path.read_bytes())
    assert regen.stale_files(tmp_path) == []
    (tmp_path / "master_pb2.py").write_text("# edited by hand\n")
    (tmp_path / "common_pb2.pyi").unlink()
    assert regen.stale_files(tmp_path) == ["common_pb2.pyi", "master_pb2.py"]


@run
async def test_cached_lookup_follows_replica_loss(stub, ch, handle) -> None:  # type: ignore[no-untyped-def]
    await _setup(stub)
    await stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id="n2"))
    await stub.MountSegment(
        master_pb2.MountSegmentRequest(node_id="n2", segment="s2", tier=2, capacity=1 << 20)
    )
    items = [master_pb2.PutStartItem(key="k", size=100, replicas=2)]
    await stub.PutStart(master_pb2.PutStartRequest(client_id="c", client_node="n2", items=items))
    await stub.PutEnd(master_pb2.PutEndRequest(client_id="c", keys=["k"]))
    req = master_pb2.BatchLookupRequest(keys=["k"], lease_ttl_ms=1)
    first = await stub.BatchLookup(req)
    assert [(r.node_id, r.tier) for r in first.results[0].replicas] == [("n2", 2), ("n1", 1)]
    assert first.lease_ttl_ms == 1
    gone = await stub.UnmountSegment(master_pb2.UnmountSegmentRequest(node_id="n2", segment="s2"))
    assert (gone.dropped_replicas, gone.removed_objects) == (1, 0)
    again = await stub.BatchLookup(req)
    assert [r.node_id for r in again.results[0].replicas] == ["n1"]
    assert again.results[0].size == 100 and again.results[0].group == "k"


def test_restarted_master_keeps_committed_objects(tmp_path: Path) -> None:
    async def body() -> None:
        cfg = MasterConfig(listen="127.0.0.1:0", db_path=str(tmp_path / "meta"))
        first = await serve(cfg)
        async with grpc.aio.insecure_channel(first.address) as ch:
            stub = master_pb2_grpc.MasterStub(ch)
            await _setup(stub)
            items = [master_pb2.PutStartItem(key=k, size=100) for k in ("done", "half")]
            await stub.PutStart(master_pb2.PutStartRequest(client_id="c", items=items))
            await stub.PutEnd(master_pb2.PutEndRequest(client_id="c", keys=["done"]))
        await first.stop(0)
        second = await serve(cfg)
        try:
            assert second.epoch != first.epoch
            async with grpc.aio.insecure_channel(second.address) as ch:
                stub = master_pb2_grpc.MasterStub(ch)
                await stub.Heartbeat(master_pb2.HeartbeatRequest(node_id="n1"), timeout=5)
                look = await stub.BatchLookup(master_pb2.BatchLookupRequest(keys=["done", "half"]))
                assert look.results[0].replicas[0].offset == 0
                # a put in flight across the restart: still WRITING (its space is not
                # handed to anyone else), and its writer's PutEnd commits it here
                assert look.results[1].status.code == common_pb2.ERROR_CODE_NOT_READY
                end = await stub.PutEnd(master_pb2.PutEndRequest(client_id="c", keys=["half"]))
                assert end.results[0].code == common_pb2.ERROR_CODE_OK
                look = await stub.BatchLookup(master_pb2.BatchLookupRequest(keys=["half"]))
                assert look.results[0].replicas[0].offset not in (0, None)
            second.state.check_integrity()
        finally:
            await second.stop(0)

    asyncio.run(body())


def test_proto_enums_match_core_types() -> None:
    from kvstore.master.model import ObjectState
    from kvstore.types import Tier

    assert {t.name: int(t) for t in Tier} == {
        n.removeprefix("TIER_"): v for n, v in common_pb2.Tier.items()
    }
    assert {s.name: int(s) for s in ObjectState} == {
        n.removeprefix("OBJECT_STATE_"): v for n, v in master_pb2.ObjectState.items()
    }
    codes = [rpc_errors.code_for(cls("x")) for cls in errors.ALL_ERRORS]
    assert len(set(codes)) == len(codes) and common_pb2.ERROR_CODE_OK not in codes


@run
async def test_big_batch_fits_in_one_message(stub, ch, handle) -> None:  # type: ignore[no-untyped-def]
    keys = [f"{i:0128x}" for i in range(50_000)]  # ~6.6 MB request: over gRPC's 4 MiB default
    async with grpc.aio.insecure_channel(handle.address, options=grpc_options()) as big:
        look = await master_pb2_grpc.MasterStub(big).BatchLookup(
            master_pb2.BatchLookupRequest(keys=keys)
        )
    assert len(look.results) == 50_000
    assert {r.status.code for r in look.results} == {common_pb2.ERROR_CODE_NOT_FOUND}


async def _persist_waits(stub, ch, handle) -> None:  # type: ignore[no-untyped-def]
    """A node that says it runs a task worker gets its SSD puts' PERSIST waited for from
    its first put (before it ever long-polled): here nobody polls, so PutEnd times out
    typed; a node that does not (a fake) is not waited for."""
    for node, tasks in (("worker", True), ("fake", False)):
        ep = common_pb2.NodeEndpoint(tcp_address=f"127.0.0.1:{7000 + tasks}")
        req = master_pb2.RegisterNodeRequest(node_id=node, endpoint=ep, runs_tasks=tasks)
        await stub.RegisterNode(req)
        await stub.MountSegment(master_pb2.MountSegmentRequest(
            node_id=node, segment=f"{node}-ssd", tier=common_pb2.TIER_SSD, capacity=1 << 20
        ))  # fmt: skip
        item = master_pb2.PutStartItem(key=f"k-{node}", size=100, preferred_node=node)
        put = await stub.PutStart(master_pb2.PutStartRequest(client_id="c", items=[item]))
        assert put.results[0].locations[0].node_id == node
        started = time.monotonic()
        end = master_pb2.PutEndRequest(client_id="c", keys=[item.key], checksums=[7])
        reply = await stub.PutEnd(end)
        status = reply.results[0]
        if tasks:
            assert isinstance(rpc_errors.error_for(status.code, status.message),
                              errors.UnavailableError)  # fmt: skip
            assert "did not persist" in status.message and time.monotonic() - started >= 0.3
        else:
            assert status.code == 0


test_put_end_waits_for_persist_of_a_node_that_runs_tasks = run(
    _persist_waits, persist_timeout_s=0.3
)
