"""AsyncClient against the real cluster: same semantics, nothing blocks the loop."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from kvstore.client import AsyncClient
from kvstore.errors import ExistsError, NotFoundError, TooLargeError
from tests.client.conftest import payload

pytestmark = pytest.mark.timeout(60)


def test_async_roundtrip_and_batches(cluster, fresh) -> None:
    async def body() -> None:
        async with AsyncClient(cluster.address, transport="tcp") as a:
            value = payload(123_457, seed=5)
            await a.put(fresh(), value)
            assert await a.get(fresh()) == value
            with pytest.raises(ExistsError):
                await a.put(fresh(), b"x")
            keys = [fresh(f"a{i}") for i in range(8)]
            values = [payload(1 << 16, seed=i) for i in range(8)]
            assert await a.batch_put(list(zip(keys, values, strict=True))) == [None] * 8
            got = await asyncio.gather(*(a.get(k) for k in keys))
            assert list(got) == values
            outs = [np.zeros(1 << 16, np.uint8), np.zeros(10, np.uint8)]
            res = await a.batch_get_into(keys[:2], outs)
            assert res[0] == 1 << 16 and isinstance(res[1], TooLargeError)
            assert outs[0].tobytes() == values[0]
            assert await a.batch_exists([keys[0], fresh("none")]) == [True, False]
            assert await a.size_of(keys[1]) == 1 << 16
            assert (await a.match_prefix(keys)).pool_length == 8
            assert (await a.stats())["objects"] >= 9
            assert await a.remove(keys[0], force=True)
            with pytest.raises(NotFoundError):
                await a.get(keys[0])

    asyncio.run(body())


def test_async_contributed_segment(cluster, fresh) -> None:
    async def body() -> None:
        client = AsyncClient(cluster.address, segment_bytes=1 << 20)
        await client.put(fresh(), b"local" * 100)
        stats = await client.stats()
        mine = [s for s in stats["segments"] if s["node_id"] == client.config.client_id]
        assert len(mine) == 1 and mine[0]["used"] > 0  # puts prefer the writer's own segment
        assert await client.get(fresh()) == b"local" * 100
        await client.close()
        after = cluster.stats()
        assert client.config.client_id not in [s.node_id for s in after.segments]

    asyncio.run(body())
