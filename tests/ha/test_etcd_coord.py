"""The etcd adapter against a real etcd: election, fencing by epoch, cluster id, paging."""

from __future__ import annotations

import asyncio

import pytest

from kvstore.errors import ExistsError, UnavailableError
from kvstore.master.coord import DeposedError, EtcdCoordinator, LeaderInfo
from tests.ha.etcd import Etcd, free_port


def test_election_fencing_and_cluster_id(etcd: Etcd) -> None:
    async def go() -> None:
        a = EtcdCoordinator([etcd.endpoint], "/t")
        b = EtcdCoordinator([etcd.endpoint], "/t")
        await a.connect()
        await b.connect()
        await a.claim_cluster("pool-a")
        await b.claim_cluster("pool-a")
        with pytest.raises(ExistsError, match=f"'/t' at {etcd.endpoint} belongs to cluster"):
            other = EtcdCoordinator([etcd.endpoint], "/t")
            await other.connect()
            await other.claim_cluster("pool-b")
        la, lb = await a.grant(2), await b.grant(2)
        ea = await a.campaign(la, LeaderInfo.value("a", "h:1"))
        assert ea is not None
        assert await b.campaign(lb, LeaderInfo.value("b", "h:2")) is None
        info = await b.leader()
        assert info is not None and (info.id, info.address, info.epoch) == ("a", "h:1", ea)
        assert await a.keepalive(la) == 2
        await a.commit(ea, [(b"o/k1", b"v1"), (b"o/k2", b"v2")])
        await a.revoke(la)  # a resigns (or its lease runs out)
        assert await a.keepalive(la) == 0
        eb = await b.campaign(lb, LeaderInfo.value("b", "h:2"))
        assert eb is not None and eb > ea
        with pytest.raises(DeposedError):  # the stale leader's write: rejected by epoch
            await a.commit(ea, [(b"o/k3", b"v3")])
        await b.commit(eb, [(b"o/k1", None)])
        assert await b.load() == [(b"o/k2", b"v2")]
        await a.close()
        await b.close()

    asyncio.run(go())


def test_load_pages_through_many_records(etcd: Etcd) -> None:
    async def go() -> None:
        c = EtcdCoordinator([etcd.endpoint], "/p")
        c.PAGE = 50
        await c.connect()
        epoch = await c.campaign(await c.grant(5), b"{}")
        assert epoch is not None
        ops = [(f"o/{i:04d}".encode(), b"x" * 10) for i in range(120)]
        for i in range(0, 120, 40):
            await c.commit(epoch, ops[i : i + 40])
        assert await c.load() == ops
        await c.compact()  # history dropped, the records stay
        await c.compact()  # again at the same revision: no error
        assert await c.load() == ops
        await c.close()

    asyncio.run(go())


def test_unreachable_etcd_names_the_endpoint() -> None:
    async def go() -> None:
        endpoint = f"127.0.0.1:{free_port()}"
        c = EtcdCoordinator([endpoint], "/x", rpc_timeout_s=0.5)
        with pytest.raises(UnavailableError, match=f"etcd at {endpoint} unreachable"):
            await c.connect()
        await c.close()

    asyncio.run(go())
