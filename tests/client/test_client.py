"""Client against a real master and two real storage-node processes on loopback."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvstore.client import Client, PutOptions
from kvstore.errors import BadRequestError, ExistsError, NotFoundError, TooLargeError
from kvstore.types import Tier
from tests.client.conftest import payload

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("transport", ["auto", "shm", "tcp"])
def test_put_from_one_client_get_from_another(cluster, fresh, transport) -> None:
    key, value = fresh(), payload(300_001, seed=1)
    a, b = (Client(cluster.address, transport=transport) for _ in range(2))
    with a, b:
        a.put(key, value, replicas=2)
        assert b.get(key) == value
        out = np.zeros(400_000, dtype=np.uint8)
        assert b.get_into(key, out) == len(value)
        assert out[: len(value)].tobytes() == value and not out[len(value) :].any()
        with pytest.raises(ExistsError):
            b.put(key, b"other")
        assert a.get(key) == value


def test_numpy_and_torch_values_and_targets(client, fresh) -> None:
    arr = np.arange(10_000, dtype=np.float32).reshape(100, 100)
    ten = torch.arange(5_000, dtype=torch.int64)
    client.put(fresh("np"), arr)
    client.put(fresh("pt"), ten)
    got = np.empty_like(arr)
    assert client.get_into(fresh("np"), got) == arr.nbytes
    assert np.array_equal(got, arr)
    back = torch.empty_like(ten)
    assert client.get_into(fresh("pt"), back) == ten.numel() * 8
    assert torch.equal(back, ten)
    assert client.get(fresh("np")) == arr.tobytes()


def test_put_from_and_get_into_registered_slices(client, fresh) -> None:
    src = np.frombuffer(payload(1 << 20, seed=2), dtype=np.uint8).copy()
    dst = np.zeros(1 << 20, dtype=np.uint8)
    client.register_buffer(src)
    client.register_buffer(dst)
    client.put_from(fresh("a"), src, offset=4096, length=65536)
    client.put_from(fresh("b"), src[100_000:100_777])
    assert client.batch_get_into([fresh("a"), fresh("b")], [dst[:65536], dst[70_000:]]) == [
        65536,
        777,
    ]
    assert dst[:65536].tobytes() == src[4096 : 4096 + 65536].tobytes()
    assert dst[70_000:70_777].tobytes() == src[100_000:100_777].tobytes()
    client.check_integrity()
    client.unregister_buffer(dst)
    client.check_integrity()
    with pytest.raises(NotFoundError):
        client.unregister_buffer(dst)
    with pytest.raises(BadRequestError):
        client.register_buffer(src[10:20])  # overlaps a registered buffer


def test_batches_give_a_result_per_key(client, fresh) -> None:
    keys = [fresh(f"b{i}") for i in range(20)]
    values = [payload(1000 + i, seed=i) for i in range(20)]
    assert client.batch_put(list(zip(keys, values, strict=True))) == [None] * 20
    again = client.batch_put([(keys[0], b"x"), (fresh("new"), b"y")])
    assert isinstance(again[0], ExistsError) and again[1] is None
    assert client.batch_get([*keys, fresh("missing")]) == [*values, None]
    outs = [bytearray(1010) for _ in range(3)]
    res = client.batch_get_into([keys[0], keys[15], fresh("missing")], outs)
    assert res[0] == 1000 and isinstance(res[1], TooLargeError)
    assert isinstance(res[2], NotFoundError)
    assert bytes(outs[0][:1000]) == values[0] and outs[1] == bytearray(1010)
    assert client.batch_exists([keys[3], fresh("missing")]) == [True, False]


def test_batches_use_one_rpc_per_phase(client, fresh) -> None:
    calls: list[str] = []

    def counting(step):  # type: ignore[no-untyped-def]
        calls.append(step.method)
        return client.call_rpc(step)

    keys = [fresh(f"c{i}") for i in range(50)]
    items = [(k, payload(4096, seed=i)) for i, k in enumerate(keys)]
    assert client.run(client.ops.batch_put(items[:25], PutOptions()), counting) == [None] * 25
    assert [c for c in calls if c != "Stats"] in (
        ["GrantExtent", "CommitExtent"], ["CommitExtent"]  # an extent from an earlier test
    )  # fmt: skip
    calls.clear()  # inside the extent: one round trip for the whole batch
    assert client.run(client.ops.batch_put(items[25:], PutOptions()), counting) == [None] * 25
    assert calls == ["CommitExtent"]
    calls.clear()  # what does not fit an extent (two replicas here) takes PutStart + PutEnd
    other = [(fresh(f"r{i}"), b"r") for i in range(3)]
    assert client.run(client.ops.batch_put(other, PutOptions(replicas=2)), counting) == [None] * 3
    assert calls == ["PutStart", "PutEnd"]
    calls.clear()  # a PutEnd grants its writer a writer lease too: read back with no call
    assert client.run(client.ops.batch_get([k for k, _ in other]), counting) == [b"r"] * 3
    assert calls == []
    calls.clear()  # the writer holds a writer lease on what it committed in its extent:
    got = client.run(client.ops.batch_get(keys), counting)  # read back with no lookup
    assert got == [v for _, v in items] and calls == []
    client._ctx.locations.drop(keys)  # forgotten: one lookup for the whole batch
    got = client.run(client.ops.batch_get(keys), counting)
    assert got == [v for _, v in items] and calls == ["BatchLookup"]
    calls.clear()  # now their locations are cached (and leased): a repeated get asks nobody
    got = client.run(client.ops.batch_get(keys), counting)
    assert got == [v for _, v in items] and calls == []


def test_exists_size_remove(client, fresh) -> None:
    key = fresh()
    assert not client.exists(key) and client.size_of(key) is None
    client.put(key, b"12345")
    hits = client.stats()["hits"]
    assert client.exists(key) and client.size_of(key) == 5
    assert client.batch_exists([key, fresh("other")]) == [True, False]
    assert client.stats()["hits"] == hits  # pure queries: no lease, no hit counted
    assert client.remove(key) is True  # not leased, so no force needed
    assert client.remove(key) is False
    with pytest.raises(NotFoundError):
        client.get(key)


def test_match_prefix_and_stats(client, fresh) -> None:
    keys = [fresh(f"p{i}") for i in range(4)]
    client.batch_put([(k, b"v" * 100) for k in keys[:3]])
    res = client.match_prefix(keys)
    assert res.pool_length == 3
    assert sum(m[2] for m in res.matches) >= 3 and all(m[1] == Tier.DRAM for m in res.matches)
    stats = client.stats()
    assert len(stats["nodes"]) >= 2 and stats["objects"] >= 3
    assert isinstance(stats["capacity"], int) and stats["master_epoch"]


def test_tenants_are_namespaced(cluster, fresh) -> None:
    key = fresh()
    with Client(cluster.address, tenant="a") as a, Client(cluster.address, tenant="b") as b:
        a.put(key, b"from-a")
        assert not b.exists(key)
        b.put(key, b"from-b")
        assert (a.get(key), b.get(key)) == (b"from-a", b"from-b")


def test_ssd_tier_is_served_over_tcp(client, fresh) -> None:
    value = payload(200_000, seed=7)
    client.put(fresh(), value, tier=Tier.SSD)
    assert client.get(fresh()) == value
    res = client.match_prefix([fresh()])
    assert [m[1] for m in res.matches] == [Tier.SSD]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_contributed_segment_serves_other_clients(cluster, fresh, transport) -> None:
    value = payload(70_000, seed=9)
    with Client(cluster.address, segment_bytes=1 << 20) as owner:
        owner.put(fresh(), value)
        assert cluster.holders(fresh()) == [owner.config.client_id]  # the writer's own segment
        with Client(cluster.address, transport=transport) as reader:
            assert reader.get(fresh()) == value
    assert owner.config.client_id not in [s.node_id for s in cluster.stats().segments]
    with Client(cluster.address) as late:
        assert not late.exists(fresh())  # its only replica left with the segment
