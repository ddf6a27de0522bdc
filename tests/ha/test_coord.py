"""The coordination layer on its in-memory fake: election, epochs, fencing, group commit."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvstore.errors import ExistsError, NotLeaderError, UnavailableError
from kvstore.master.coord import DeposedError, HAConfig, LeaderInfo, MemoryCoordinator, MemoryEtcd
from kvstore.master.ha import ReplicatedJournal, chunked, connect_with_backoff
from kvstore.master.journal import Snapshot, snapshot_of
from kvstore.master.model import Endpoint, NodeInfo

HA = HAConfig(etcd=("memory:1",), cluster_id="pool-a", max_txn_ops=3)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_one_candidate_wins_and_epochs_grow() -> None:
    clock = Clock()
    store = MemoryEtcd(clock)
    a, b = MemoryCoordinator(store), MemoryCoordinator(store)

    async def go() -> None:
        la, lb = await a.grant(2), await b.grant(2)
        ea = await a.campaign(la, LeaderInfo.value("a", "h:1"))
        assert ea is not None
        assert await b.campaign(lb, LeaderInfo.value("b", "h:2")) is None
        info = await b.leader()
        assert info is not None and (info.id, info.address, info.epoch) == ("a", "h:1", ea)
        clock.now = 1.9
        assert await a.keepalive(la) == 2  # renewed until 3.9
        clock.now = 3.0
        assert await b.leader() is not None
        clock.now = 4.0  # a's lease ran out: its key went with it
        assert await b.leader() is None
        lb = await b.grant(2)
        eb = await b.campaign(lb, LeaderInfo.value("b", "h:2"))
        assert eb is not None and eb > ea
        assert await a.keepalive(la) == 0

    run(go())


def test_a_deposed_epoch_cannot_write() -> None:
    clock = Clock()
    store = MemoryEtcd(clock)
    a, b = MemoryCoordinator(store), MemoryCoordinator(store)

    async def go() -> None:
        ea = await a.campaign(await a.grant(1), b"{}")
        assert ea is not None
        await a.commit(ea, [(b"o/k1", b"v1")])
        clock.now = 5.0
        eb = await b.campaign(await b.grant(1), b"{}")
        assert eb is not None
        with pytest.raises(DeposedError) as info:
            await a.commit(ea, [(b"o/k2", b"v2")])
        assert isinstance(info.value, NotLeaderError)
        await b.commit(eb, [(b"o/k3", b"v3"), (b"o/k1", None)])
        assert await b.load() == [(b"o/k3", b"v3")]

    run(go())


def test_two_clusters_on_one_prefix_are_refused() -> None:
    store = MemoryEtcd()

    async def go() -> None:
        await MemoryCoordinator(store).claim_cluster("pool-a")
        await MemoryCoordinator(store).claim_cluster("pool-a")  # the same pool: fine
        with pytest.raises(ExistsError, match="belongs to cluster 'pool-a', not 'pool-b'"):
            await MemoryCoordinator(store).claim_cluster("pool-b")
        await MemoryCoordinator(store, prefix="/other").claim_cluster("pool-b")

    run(go())


def test_unreachable_coordinator_is_retried_then_named() -> None:
    store = MemoryEtcd(down=True)
    coord = MemoryCoordinator(store)
    ha = HAConfig(etcd=("memory:1",), cluster_id="pool-a", connect_timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(UnavailableError, match=r"unreachable.*gave up after [3-9] tries"):
        run(connect_with_backoff(coord, ha))
    assert 0.5 <= time.monotonic() - started < 2.0


def test_chunks_respect_op_and_byte_limits() -> None:
    ops = [(f"o/{i}".encode(), b"x" * 100) for i in range(7)]
    assert [len(c) for c in chunked(ops, 3, 1 << 20)] == [3, 3, 1]
    assert [len(c) for c in chunked(ops, 100, 300)] == [2, 2, 2, 1]
    assert chunked([], 3, 100) == []
    assert [op for c in chunked(ops, 3, 300) for op in c] == ops


def _node(i: int) -> NodeInfo:
    return NodeInfo(f"n{i}", Endpoint(f"127.0.0.1:{i}", "host", "", b"", ""), 0.0)


def test_group_commit_batches_and_last_record_wins() -> None:
    store = MemoryEtcd()
    coord = MemoryCoordinator(store)

    async def go() -> None:
        epoch = await coord.campaign(await coord.grant(5), b"{}")
        assert epoch is not None
        journal = ReplicatedJournal(coord, epoch, Snapshot(), HA)
        flusher = asyncio.create_task(journal.run())
        for i in range(10):
            journal.save_node(_node(i))
        journal.drop_node("n3")
        assert journal.durable == 0
        await journal.sync()
        assert journal.durable == journal.seq == 11
        assert journal.batches == 1  # one batch of 10 records ...
        assert store.commits == 4  # ... in txns of max_txn_ops=3 (n3 put then dropped: 1 op)
        snap = snapshot_of(await coord.load())
        assert sorted(n["id"] for n in snap.nodes) == sorted(f"n{i}" for i in range(10) if i != 3)
        flusher.cancel()

    run(go())


def test_outage_is_retried_and_deposition_fails_waiters() -> None:
    clock = Clock()
    store = MemoryEtcd(clock)
    coord = MemoryCoordinator(store)

    async def go() -> None:
        epoch = await coord.campaign(await coord.grant(2), b"{}")
        assert epoch is not None
        journal = ReplicatedJournal(coord, epoch, Snapshot(), HA)
        flusher = asyncio.create_task(journal.run())
        store.down = True
        journal.save_node(_node(1))
        waiter = asyncio.create_task(journal.sync())
        await asyncio.sleep(0.2)
        assert not waiter.done() and journal.durable == 0
        store.down = False
        await asyncio.wait_for(waiter, 2.0)
        assert [n["id"] for n in snapshot_of(await coord.load()).nodes] == ["n1"]
        clock.now = 10.0  # lease gone: the next batch is refused by the fence
        journal.save_node(_node(2))
        with pytest.raises(DeposedError):
            await asyncio.wait_for(journal.sync(), 2.0)
        assert flusher.done()
        assert [n["id"] for n in snapshot_of(await coord.load()).nodes] == ["n1"]

    run(go())


def test_not_leader_messages_name_the_leader() -> None:
    err = NotLeaderError.parse("UNAVAILABLE: not leader: leader is 127.0.0.1:7001 (x follows)")
    assert err is not None and err.leader == "127.0.0.1:7001"
    unknown = NotLeaderError.parse("not leader: leader is unknown (no leader elected)")
    assert unknown is not None and unknown.leader == ""
    assert NotLeaderError.parse("failed to connect to all addresses") is None
