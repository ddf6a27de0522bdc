"""Two HA masters in this process on the in-memory coordinator, a real client between
them: election, refusal by followers, failover of the client and its lent segment,
metadata restored by the new leader, fencing of a leader cut off from etcd."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import grpc
import pytest

from kvstore import fastlane
from kvstore.client import Client
from kvstore.errors import NotLeaderError, NotReadyError, UnavailableError
from kvstore.master.config import MasterConfig
from kvstore.master.coord import HAConfig, MemoryCoordinator, MemoryEtcd
from kvstore.master.ha import HAMaster
from kvstore.rpc_errors import raise_from_rpc_error
from kvstore.v1 import master_pb2, master_pb2_grpc

TTL = 1


class LoopThread:
    """An event loop in a thread: the masters live there, blocking clients here."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def masters() -> Iterator[tuple[LoopThread, list[HAMaster], MemoryEtcd]]:
    lt = LoopThread()
    store = MemoryEtcd(time.monotonic)
    config = MasterConfig(
        listen="127.0.0.1:0", node_ttl_s=3.0, heartbeat_interval_s=0.2, tick_interval_s=0.05
    )
    ha = HAConfig(etcd=("memory:1",), cluster_id="pool-a", lease_ttl_s=TTL, poll_s=0.05)

    async def start() -> list[HAMaster]:
        return [await HAMaster(config, ha, MemoryCoordinator(store)).start() for _ in range(2)]

    ms = lt.call(start())
    try:
        yield lt, ms, store
    finally:
        for m in ms:
            lt.call(m.stop())
        lt.close()


def wait_leader(ms: list[HAMaster], not_: HAMaster | None = None, timeout: float = 5.0) -> HAMaster:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leaders = [m for m in ms if m.role == "leader" and m is not not_]
        if leaders:
            assert len([m for m in ms if m.role == "leader"]) == 1
            return leaders[0]
        time.sleep(0.02)
    raise TimeoutError("no leader")


def stats_of(address: str) -> master_pb2.StatsResponse:
    with grpc.insecure_channel(address) as ch:
        try:
            return master_pb2_grpc.MasterStub(ch).Stats(master_pb2.StatsRequest(), timeout=5)
        except grpc.RpcError as err:
            raise_from_rpc_error(err)


def test_follower_refuses_naming_the_leader(masters: Any) -> None:
    _, ms, _ = masters
    leader = wait_leader(ms)
    follower = next(m for m in ms if m is not leader)
    deadline = time.monotonic() + 2
    while follower.leader_hint != leader.address and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(NotLeaderError) as info:
        stats_of(follower.address)
    assert info.value.leader == leader.address
    assert stats_of(leader.address).master_epoch == str(leader.epoch)


def test_failover_keeps_committed_objects_and_fences_the_old_leader(masters: Any) -> None:
    _, ms, _ = masters
    old = wait_leader(ms)
    addresses = ",".join(m.address for m in sorted(ms, key=lambda m: m is old))  # follower 1st
    with Client(addresses, segment_bytes=4 << 20, failover_timeout_s=10) as c:
        for i in range(20):
            c.put(f"k{i}", bytes([i]) * 1000)
        old.coord.cut = True  # the leader alone loses etcd (a partition)
        cut_at = time.monotonic()
        while old.serving() is not None:
            time.sleep(0.01)
        # it stopped serving before its lease could have run out in etcd
        assert time.monotonic() - cut_at < TTL
        with pytest.raises(NotLeaderError):
            stats_of(old.address)
        new = wait_leader(ms, not_=old)
        assert new.epoch > old.epoch
        for i in range(20):  # restored metadata; the bytes never left the client's segment
            assert c.get(f"k{i}") == bytes([i]) * 1000
        c.put("after", b"x" * 100)
        assert c.get("after") == b"x" * 100
        time.sleep(3.5)  # past node_ttl_s: the lent segment re-joined, or its objects went
        assert c.get("k0") == bytes([0]) * 1000
        assert int(stats_of(new.address).objects) == 21
        assert old.role == "follower"
        new.state.check_integrity()


def test_async_client_follows_the_leader(masters: Any) -> None:
    from kvstore.client import AsyncClient

    _, ms, _ = masters
    old = wait_leader(ms)
    follower_first = ",".join(m.address for m in sorted(ms, key=lambda m: m is old))

    async def go() -> None:
        async with AsyncClient(follower_first, segment_bytes=4 << 20, failover_timeout_s=10) as c:
            await c.put("a", b"1" * 100)  # sent to the follower first: refused, redirected
            old.coord.cut = True
            new = await asyncio.to_thread(wait_leader, ms, old)
            assert await c.get("a") == b"1" * 100
            await c.put("b", b"2" * 100)
            assert new.state is not None and "b" in new.state.objects

    asyncio.run(go())


def test_clients_use_the_leaders_fast_lane_and_follow_it(
    masters: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fastlane, "RETRY_AFTER_S", 0.0)  # probe again at the next call
    _, ms, _ = masters
    old = wait_leader(ms)
    assert all(m.lane_address for m in ms)
    addresses = ",".join(m.address for m in ms)
    with Client(addresses, segment_bytes=4 << 20, failover_timeout_s=10) as c:
        c.put("a", b"1" * 100)
        assert c._router.lane is not None and c._router.lane.address == old.lane_address
        old.coord.cut = True
        deadline = time.monotonic() + 5
        while old.serving() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        new = wait_leader(ms, not_=old)
        c.put("b", b"2" * 100)  # the old leader's lane refuses it: gRPC follows the leader
        assert c._router.fallbacks >= 1
        assert c.get("b") == b"2" * 100 and c.get("a") == b"1" * 100
        # (both reads came from the writer's cache; its extent, restored by the new leader,
        # took "b"'s commit: the next master call is the first to probe the new lane)
        c.put("c", b"3" * 100)
        assert c._router.lane is not None and c._router.lane.address == new.lane_address
        new.state.check_integrity()


def test_a_new_leader_honours_the_read_leases_of_the_last(masters: Any) -> None:
    """A reader's lease (and the location it cached under it) outlives a failover: the
    new leader holds every restored object for the longest lease granted, then frees it."""
    _, ms, _ = masters
    old = wait_leader(ms)
    addresses = ",".join(m.address for m in ms)
    opts: dict[str, Any] = {"segment_bytes": 4 << 20, "failover_timeout_s": 10}
    # the writer asks for no writer lease (it caches nothing): only the read lease counts
    writer: dict[str, Any] = {**opts, "location_cache_entries": 0}
    with Client(addresses, lease_ttl_s=1.5, **opts) as reader, Client(addresses, **writer) as other:
        other.put("k", b"v" * 100)  # (a writer would read its own put from its writer lease)
        assert reader.get("k") == b"v" * 100  # a leased lookup: 1.5 s, and cached
        assert old.granted_lease_s == 1.5
        old.coord.cut = True
        new = wait_leader(ms, not_=old)
        elected = time.monotonic()
        assert new.granted_lease_s == 1.5  # restored from the journal
        with pytest.raises(NotReadyError):
            other.remove("k")  # the old leader's lease still holds
        assert reader.get("k") == b"v" * 100
        deadline = time.monotonic() + 10
        while True:
            try:
                assert other.remove("k") is True
                break
            except NotReadyError:
                assert time.monotonic() < deadline
                time.sleep(0.05)  # polling the new leader's hold
        assert time.monotonic() - elected < 1.5 + 1.0  # held no longer than the lease
        assert not other.exists("k")
        new.state.check_integrity()


def test_a_shared_lease_blocks_a_remover_the_new_leader_never_saw(masters: Any) -> None:
    """Found by the Jepsen check after a clean handover: a row leased by the takeover's
    hold and then by a reader is SHARED, and a remover the new leader had never seen was
    taken for that shared reader, so its remove went through the reader's live lease."""
    lt, ms, _ = masters
    old = wait_leader(ms)
    addresses = ",".join(m.address for m in ms)
    opts: dict[str, Any] = {"segment_bytes": 4 << 20, "failover_timeout_s": 10}
    writer: dict[str, Any] = {**opts, "location_cache_entries": 0}  # see the test above
    with Client(addresses, lease_ttl_s=2.0, **opts) as reader, Client(addresses, **writer) as other:
        other.put("k", b"v" * 100)  # not the reader: see the test above
        assert reader.get("k") == b"v" * 100  # a 2 s lease, cached for 1.6 s
        cached_until = time.monotonic() + 2.0 * 0.8
        lt.call(old.stop())  # a clean handover: the next leader within a poll
        new = wait_leader(ms, not_=old)
        assert new.state is not None
        while time.monotonic() < cached_until + 0.1:
            time.sleep(0.02)  # the reader's cached entry ends; the takeover's hold does not
        assert new.state.objects["k"].lease_until > new.state.clock()
        assert reader.get("k") == b"v" * 100  # a lookup on the new leader, under the hold
        with pytest.raises(NotReadyError):
            other.remove("k")  # its first call to the new leader
        assert reader.get("k") == b"v" * 100


def test_a_write_cut_off_mid_commit_is_of_unknown_outcome_not_retried(masters: Any) -> None:
    """Found by the Jepsen check at a handover: a Remove ran on the leader, leadership
    ended while its record was on its way to etcd (where it landed), the refusal sent
    the client to the next leader, and the retried Remove answered False. A write that
    ran is answered 'outcome unknown' (DEADLINE_EXCEEDED: kvstore.failover does not
    retry it), never a refusal."""
    _, ms, _ = masters
    old = wait_leader(ms)
    addresses = ",".join(m.address for m in ms)
    # no location cache: no writer lease, which the next leader would hold "k" for
    with Client(
        addresses, segment_bytes=4 << 20, failover_timeout_s=10, location_cache_entries=0
    ) as c:
        c.put("k", b"v" * 100)
        old.coord.cut = True  # the leader alone loses etcd: its commit cannot land
        with pytest.raises(UnavailableError, match="outcome unknown: Remove ran"):
            c.remove("k")
        new = wait_leader(ms, not_=old)
        assert new.state is not None and "k" in new.state.objects  # it did not happen
        assert c.remove("k") is True  # the caller decides to retry, knowing that
