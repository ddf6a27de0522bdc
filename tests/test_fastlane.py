"""The master's fast lane (kvstore.fastlane) against a real master process: the hot path
goes over it, errors come back typed, a restart falls back to gRPC and finds the new
lane, hostile bytes close only their own connection, and the async client uses it too."""

from __future__ import annotations

import asyncio
import contextvars
import socket
import struct
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from kvstore import busypoll, fastlane
from kvstore.busypoll import MISSES_BEFORE_BACKOFF
from kvstore.client.aio import AsyncClient
from kvstore.client.client import Client
from kvstore.errors import BadRequestError, ExistsError, NotFoundError
from kvstore.fastlane import HEADER, METHODS, SyncLane
from kvstore.v1 import master_pb2
from tests.cluster import Cluster


@pytest.fixture()
def cluster(tmp_path: Any) -> Iterator[Cluster]:
    with Cluster(nodes=1, dram_bytes=16 << 20, workdir=tmp_path) as c:
        yield c


class Counted:
    """Counts the calls each path carries: lane calls by method, gRPC calls by method."""

    def __init__(self, client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lane: Counter[str] = Counter()
        self.grpc: Counter[str] = Counter()
        real_lane, real_grpc = SyncLane.call, client.call_rpc

        def lane_call(lane: SyncLane, method: str, request: Any) -> Any:
            self.lane[method] += 1
            return real_lane(lane, method, request)

        def grpc_call(step: Any) -> Any:
            self.grpc[step.method] += 1
            return real_grpc(step)

        monkeypatch.setattr(SyncLane, "call", lane_call)
        monkeypatch.setattr(client, "call_rpc", grpc_call)


def test_hot_path_goes_over_the_lane(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    with Client(cluster.address, location_cache_entries=0, extent_bytes=0) as c:
        counted = Counted(c, monkeypatch)
        c.put("a", b"x" * 1000)
        assert c.get("a") == b"x" * 1000
        for i in range(5):
            c.put(f"k{i}", bytes([i]) * 4096)
            assert c.get(f"k{i}") == bytes([i]) * 4096
        # one gRPC Stats found the lane; everything after went over it
        assert counted.grpc == Counter({"Stats": 1})
        assert counted.lane["PutStart"] == counted.lane["PutEnd"] == 6
        assert counted.lane["BatchLookup"] == 6
        assert cluster.stats().fast_lane


def test_extent_puts_go_over_the_lane(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    with Client(cluster.address) as c:
        counted = Counted(c, monkeypatch)
        for i in range(10):
            c.put(f"e{i}", bytes([i]) * 10_000)
        assert counted.lane == Counter({"GrantExtent": 1, "CommitExtent": 10})
        assert [c.get(f"e{i}") for i in range(10)] == [bytes([i]) * 10_000 for i in range(10)]


def test_errors_come_back_typed(cluster: Cluster) -> None:
    with Client(cluster.address) as c:
        c.put("dup", b"1")
        with pytest.raises(ExistsError):
            c.put("dup", b"2")
        with pytest.raises(NotFoundError):
            c.get("missing")
        lane = SyncLane(cluster.stats().fast_lane, timeout_s=5.0)
        try:  # a whole-call error (an abort in the servicer): its status, as over gRPC
            with pytest.raises(BadRequestError, match="client_id"):
                lane.call("PutStart", master_pb2.PutStartRequest())
            with pytest.raises(BadRequestError):
                lane.call("Remove", master_pb2.RemoveRequest())  # not a lane method
        finally:
            lane.close()
        assert c.get("dup") == b"1"


def test_restart_falls_back_then_finds_the_new_lane(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fastlane, "RETRY_AFTER_S", 0.0)  # probe again at the next call
    with Client(cluster.address, location_cache_entries=0, extent_bytes=0) as c:
        counted = Counted(c, monkeypatch)
        c.put("before", b"b")
        old_lane = cluster.stats().fast_lane
        cluster.restart_master()
        cluster.wait_stats(lambda s: len(s.segments) == 1)
        c.put("after", b"a")  # the old lane's connection is dead: this one goes by gRPC
        assert counted.grpc["PutStart"] == 1 and c._router.fallbacks == 1
        lookups = counted.lane["BatchLookup"]
        assert c.get("after") == b"a"  # a new probe found the new master's lane
        assert counted.lane["BatchLookup"] == lookups + 1
        new_lane = cluster.stats().fast_lane
        assert c._router.lane is not None and c._router.lane.address == new_lane != old_lane


@pytest.mark.parametrize("where", ["tcp", "unix"])
def test_hostile_bytes_close_only_their_connection(cluster: Cluster, where: str) -> None:
    stats = cluster.stats()
    address = stats.fast_lane if where == "tcp" else stats.fast_lane_local
    with fastlane._connect(address, 5) as bad:
        bad.sendall(struct.pack("<I", 0xFFFFFFF0) + b"junk")  # a frame longer than allowed
        bad.settimeout(5)
        assert bad.recv(16) == b""  # the master closed it
    with fastlane._connect(address, 5) as s:
        s.settimeout(5)
        s.sendall(HEADER.pack(5 + 3, 7, METHODS.index("BatchLookup")) + b"\xff\xff\xff")
        n, ident, status = HEADER.unpack(_recv(s, HEADER.size))
        body = _recv(s, n - 5)
        assert (ident, status) == (7, 3)  # INVALID_ARGUMENT: a message that does not parse
        assert body
        s.sendall(HEADER.pack(5, 8, 200))  # an unknown method
        n, ident, status = HEADER.unpack(_recv(s, HEADER.size))
        _recv(s, n - 5)
        assert (ident, status) == (8, 12)  # UNIMPLEMENTED
    with Client(cluster.address) as c:  # everyone else is served as before
        c.put("still", b"ok")
        assert c.get("still") == b"ok"


def test_a_client_on_the_masters_host_uses_its_unix_socket(cluster: Cluster) -> None:
    stats = cluster.stats()
    assert stats.fast_lane_local.startswith(fastlane.UNIX)
    with Client(cluster.address) as c:
        c.put("u", b"unix")
        assert c.get("u") == b"unix"
        lane = c._router.lane
        assert lane is not None and lane.local == stats.fast_lane_local
        assert lane._sock().family == socket.AF_UNIX


def test_a_client_polls_for_its_replies_unless_told_not_to(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """busy_poll_us (kvstore.busypoll): each lane call polls for its reply before it
    sleeps, and the replies are the same; 0 (or one CPU) sleeps at once."""
    monkeypatch.setattr(busypoll, "cpus", lambda: 2)  # as on CI's 2 cores, one idle
    monkeypatch.setattr(busypoll, "spare_cpu", lambda: True)
    for budget_us in (500, 0):
        with Client(cluster.address, busy_poll_us=budget_us) as c:
            for i in range(20):
                c.put(f"p{budget_us}-{i}", bytes([i]) * 5000)
            assert [c.get(f"p{budget_us}-{i}") for i in range(20)] == [
                bytes([i]) * 5000 for i in range(20)
            ]
            lane = c._router.lane
            assert lane is not None
            spinner = lane._local.spinner
            assert spinner.budget_s == budget_us / 1e6
            if budget_us:  # polls that caught their reply or missed it: some of each call
                assert spinner.hits + spinner.missed >= MISSES_BEFORE_BACKOFF
            else:
                assert spinner.hits == spinner.missed == 0


def test_an_unreachable_unix_name_falls_back_to_tcp(cluster: Cluster) -> None:
    """As from another host or network namespace: the name does not connect, so the
    lane uses TCP, and stops trying the name."""
    stats = cluster.stats()
    missing = f"{fastlane.UNIX}kvstore-lane-{'0' * 16}"
    lane = SyncLane(stats.fast_lane, 5.0, missing)
    try:
        reply = lane.call("Stats", master_pb2.StatsRequest())
        assert reply.fast_lane == stats.fast_lane
        assert lane._sock().family == socket.AF_INET and lane.local == ""
    finally:
        lane.close()

    async def main() -> None:
        alane = fastlane.AsyncLane(stats.fast_lane, 5.0, missing)
        try:
            reply = await alane.call("Stats", master_pb2.StatsRequest())
            assert reply.fast_lane_local == stats.fast_lane_local and alane.local == ""
        finally:
            alane.close()

    asyncio.run(asyncio.wait_for(main(), 30.0))


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "connection closed"
        out += chunk
    return out


def test_async_client_uses_the_lane(cluster: Cluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.address) as c:
            await asyncio.gather(*(c.put(f"a{i}", bytes([i]) * 100) for i in range(8)))
            values = await asyncio.gather(*(c.get(f"a{i}") for i in range(8)))
            assert values == [bytes([i]) * 100 for i in range(8)]
            lane = c._router.lane
            assert lane is not None and c._router.fallbacks == 0
            conn = lane._conn
            assert conn is not None and conn.transport is not None
            assert conn.transport.get_extra_info("socket").family == socket.AF_UNIX
            with pytest.raises(ExistsError):
                await c.put("a0", b"again")

    asyncio.run(main())


def test_master_without_lane_serves_grpc(tmp_path: Any) -> None:
    with (
        Cluster(nodes=1, workdir=tmp_path, master_options={"fast_lane": 0}) as cluster,
        Client(cluster.address) as c,
    ):
        c.put("k", b"v")
        assert c.get("k") == b"v"
        assert cluster.stats().fast_lane == cluster.stats().fast_lane_local == ""
        assert c._router.lane is None


class _Waiting:
    """A stand-in servicer: Stats answers at once; NodeTasks waits for `go`, and each
    call sees only its own context variable."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.entered: asyncio.Queue[str] = asyncio.Queue()
        self.cancelled = 0
        self.seen: list[str] = []

    async def Stats(self, request: Any, context: Any) -> Any:
        return master_pb2.StatsResponse(fast_lane="now")

    async def NodeTasks(self, request: Any, context: Any) -> Any:
        _VAR.set(request.node_id)
        self.entered.put_nowait(request.node_id)
        try:
            await self.go.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        await asyncio.sleep(0)  # a bare yield too
        self.seen.append(_VAR.get())
        return master_pb2.NodeTasksResponse()


_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("lane_test", default="")


def test_calls_run_inline_until_they_wait_and_waiting_ones_resume() -> None:
    """kvstore.fastlane runs each request eagerly in data_received: a call that never
    waits is answered with no Task; one that waits is resumed by a Task in its own
    context, answered when what it waits on is done; stopping the lane cancels it
    inside the servicer's await."""

    async def main() -> None:
        servicer = _Waiting()
        lane = await fastlane.FastLaneServer.start(servicer, "127.0.0.1")
        client = fastlane.AsyncLane(lane.address, timeout_s=5.0)
        try:
            reply = await client.call("Stats", master_pb2.StatsRequest())
            assert reply.fast_lane == "now" and not lane.tasks  # answered inline
            waits = [
                asyncio.ensure_future(
                    client.call("NodeTasks", master_pb2.NodeTasksRequest(node_id=f"n{i}"))
                )
                for i in range(3)
            ]
            for _ in waits:  # each has reached its wait: a Task holds it now
                await servicer.entered.get()
            assert len(lane.tasks) == 3 and not any(w.done() for w in waits)
            servicer.go.set()
            await asyncio.wait_for(asyncio.gather(*waits), 5.0)
            assert sorted(servicer.seen) == ["n0", "n1", "n2"]  # each its own context
            servicer.go.clear()
            late = asyncio.ensure_future(
                client.call("NodeTasks", master_pb2.NodeTasksRequest(node_id="late"))
            )
            assert await servicer.entered.get() == "late"
            await lane.stop()
            assert servicer.cancelled == 1  # the wait inside the servicer was cancelled
            with pytest.raises(fastlane.LaneDown):  # its connection closed with the lane
                await asyncio.wait_for(late, 5.0)
        finally:
            client.close()
            await lane.stop()

    asyncio.run(asyncio.wait_for(main(), 30.0))
