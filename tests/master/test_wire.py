"""Hand-built reply encodings equal upb's, byte for byte, for the same messages."""

from __future__ import annotations

import pytest

from kvstore.errors import NoSpaceError, NotFoundError
from kvstore.master import wire
from kvstore.master.service import to_pb_location
from kvstore.rpc_errors import code_for
from kvstore.types import Location, Tier
from kvstore.v1 import master_pb2

LOCS = [
    Location("n1", Tier.DRAM, "seg-a", 0, 4096),
    Location("n2", Tier.HBM, "seg-b", (1 << 40) + 5, 1 << 20),
    Location("ü-node", Tier.SSD, "s", 127, 128),
]


def _status(exc: Exception | None) -> master_pb2.KeyStatus:
    if exc is None:
        return master_pb2.KeyStatus()
    return master_pb2.KeyStatus(code=code_for(exc), message=str(exc))  # type: ignore[arg-type]


def test_varint_edges() -> None:
    for n in (0, 1, 127, 128, 300, 16383, 16384, (1 << 63) + 1):
        msg = master_pb2.PutStartItem(size=n).SerializeToString()
        assert msg == (b"\x10" + wire.varint(n) if n else b"")


def test_locations_match_upb() -> None:
    enc = wire.LocationEncoder()
    for loc in LOCS + LOCS:  # second pass: cached prefixes
        assert enc.encode(loc) == to_pb_location(loc).SerializeToString()


def test_put_start_response_matches_upb() -> None:
    results: list[list[Location] | NoSpaceError] = [LOCS[:1], NoSpaceError("full"), LOCS, []]
    got = wire.put_start_response(results, wire.LocationEncoder())
    want = master_pb2.PutStartResponse(
        results=[
            master_pb2.PutStartResult(status=_status(r))
            if isinstance(r, NoSpaceError)
            else master_pb2.PutStartResult(
                status=_status(None), locations=[to_pb_location(x) for x in r]
            )
            for r in results
        ]
    )
    assert got.SerializeToString() == want.SerializeToString()
    assert (
        got.results[1].status.message == "full"
        and got.results[2].locations[1].offset == (1 << 40) + 5
    )


def test_statuses_match_upb() -> None:
    for results in ([None, None, None], [None, NotFoundError("gone"), None], []):
        payload = wire.statuses_payload(results)
        want = master_pb2.PutEndResponse(results=[_status(r) for r in results])
        assert payload == want.SerializeToString()


def _servicer_with_pool():  # type: ignore[no-untyped-def]
    from kvstore.master.config import MasterConfig
    from kvstore.master.metadata import MasterState
    from kvstore.master.model import Endpoint
    from kvstore.master.service import MasterServicer

    state = MasterState(MasterConfig())
    for node in ("a", "b", "ü"):
        state.register_node(node, Endpoint())
        state.mount_segment(node, f"{node}-seg", Tier.DRAM, 1 << 40)
    state.mount_segment("a", "a-hbm", Tier.HBM, 1 << 20)
    return state, MasterServicer(state, "epoch")


def _want_lookup(state, key: str, err: Exception | None = None) -> bytes:  # type: ignore[no-untyped-def]
    if err is not None:
        return master_pb2.LookupResult(status=_status(err)).SerializeToString()
    o = state.objects[key]
    return master_pb2.LookupResult(
        status=_status(None), size=o.size, group=o.group, checksum=o.checksum,
        replicas=[to_pb_location(loc) for loc in o.replicas],
    ).SerializeToString()  # fmt: skip


@pytest.mark.parametrize("small", [0, 10**6])
def test_batched_replies_match_upb(small: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """PutStart and BatchLookup replies, encoded for a whole batch from the object
    table (numpy), are upb's bytes: one and two replicas, named and own groups, zero
    and huge offsets, checksums, unicode, errors in between."""
    import asyncio

    from kvstore.master import batch

    monkeypatch.setattr(batch, "SMALL", small)  # 0: numpy for every batch; big: key by key
    monkeypatch.setattr(wire, "SMALL_BATCH", small)
    state, svc = _servicer_with_pool()
    items = [
        master_pb2.PutStartItem(key="k1", size=100, replicas=2, group="g"),
        master_pb2.PutStartItem(key="k2", size=300),
        master_pb2.PutStartItem(key="k2", size=300),  # twice: ExistsError
        master_pb2.PutStartItem(key="", size=1),  # bad key
        master_pb2.PutStartItem(key="ключ/3", size=(1 << 33) + 7, group="группа"),
        master_pb2.PutStartItem(key="k4", size=1, tier=0),  # HBM
        *(master_pb2.PutStartItem(key=f"r{i}", size=4096 * (i + 1)) for i in range(40)),
    ]
    keys = [it.key for it in items if it.key]
    sums = [0 if i % 3 else (1 << 64) - 1 - i for i in range(len(keys))]

    async def body() -> tuple[master_pb2.PutStartResponse, master_pb2.BatchLookupResponse]:
        put = await svc.PutStart(master_pb2.PutStartRequest(client_id="c", items=items), None)
        await svc.PutEnd(master_pb2.PutEndRequest(client_id="c", keys=keys, checksums=sums), None)
        req = master_pb2.BatchLookupRequest(keys=["nope", *keys, "k1"], client_id="r")
        return put, await svc.BatchLookup(req, None)

    put, got = asyncio.run(body())
    assert [r.status.code for r in put.results][2:4] != [0, 0]
    for it, r in zip(items, put.results, strict=True):
        if r.status.code == 0:
            locs = state.objects[it.key].replicas
            want = master_pb2.PutStartResult(
                status=_status(None), locations=[to_pb_location(x) for x in locs]
            )
            assert r.SerializeToString() == want.SerializeToString()
    missing = _want_lookup(state, "", NotFoundError("unknown key 'nope'"))
    assert got.results[0].SerializeToString() == missing
    for key, r in zip([*keys, "k1"], got.results[1:], strict=True):
        assert r.SerializeToString() == _want_lookup(state, key), key
    assert len(got.results[1].replicas) == 2 and got.results[1].group == "g"
    assert (got.results[2].group, got.results[4].group) == ("k2", "группа")  # own group: the key


def test_varints_match_scalar() -> None:
    import numpy as np

    vals = np.array([0, 1, 127, 128, 300, 16383, 16384, (1 << 63) + 1, (1 << 64) - 1], np.uint64)
    mat, lens = wire.varints(vals)
    for v, row, n in zip(vals.tolist(), mat, lens.tolist(), strict=True):
        assert bytes(row[:n]) == wire.varint(v)


def test_uniform_batches_match_upb(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys of one length and one size (a batch of block hashes): the encoder's whole-row
    paths (every row's piece of one length) still give upb's bytes, with a miss and a
    two-replica key among them (encoded on their own)."""
    import asyncio

    from kvstore.master import batch

    monkeypatch.setattr(batch, "SMALL", 0)
    monkeypatch.setattr(wire, "SMALL_BATCH", 0)
    state, svc = _servicer_with_pool()
    keys = [f"{i:032x}" for i in range(64)]
    items = [master_pb2.PutStartItem(key=k, size=1 << 20) for k in keys]
    items[5] = master_pb2.PutStartItem(key=keys[5], size=1 << 20, replicas=2)

    async def body() -> master_pb2.BatchLookupResponse:
        await svc.PutStart(master_pb2.PutStartRequest(client_id="c", items=items), None)
        await svc.PutEnd(master_pb2.PutEndRequest(client_id="c", keys=keys), None)
        req = master_pb2.BatchLookupRequest(keys=[*keys[:9], "f" * 32, *keys[9:]])
        return await svc.BatchLookup(req, None)

    got = asyncio.run(body())
    assert got.results[9].status.code != 0
    for key, r in zip([*keys[:9], *keys[9:]], [*got.results[:9], *got.results[10:]], strict=True):
        assert r.SerializeToString() == _want_lookup(state, key), key


def _columns(cols: object) -> tuple[object, ...]:
    names = ("keys", "sizes", "replicas", "preferred", "groups", "tiers", "pin_ttls")
    errors = {i: (type(e), str(e)) for i, e in cols.errors.items()}  # type: ignore[attr-defined]
    return (*(getattr(cols, n) for n in names), errors)


@pytest.mark.parametrize("seed", range(40))
def test_put_request_columns_match_put_columns(seed: int) -> None:
    """The key-and-size-only fast path reads every request as put_columns does: items with
    any other field set (even to a value proto3 would not encode as default: an explicit
    tier 0), non-ASCII, empty or oversized keys, sizes of every varint length."""
    import random

    from kvstore.master.service import put_columns, put_request_columns

    rng = random.Random(seed)
    req = master_pb2.PutStartRequest(client_id="c" * rng.randint(0, 200), client_node="n")
    odd = rng.random() < 0.5  # half the requests: one item with one more field or odd value
    for i in range(rng.choice([17, 64, 300])):
        key = f"{seed}-{i}-" + "k" * rng.choice([0, 5, 120, 300])
        req.items.add(key=key, size=rng.choice([1, 127, 128, 1 << 14, 1 << 35, 1 << 62]))
    if odd:
        it = req.items[rng.randrange(len(req.items))]
        change = rng.choice(["replicas", "node", "group", "tier", "pin", "key", "size", "utf8"])
        if change == "replicas":
            it.replicas = rng.choice([1, 2, 17])
        elif change == "node":
            it.preferred_node = "n2"
        elif change == "group":
            it.group = "g"
        elif change == "tier":
            it.tier = rng.choice([0, 1, 7])
        elif change == "pin":
            it.pin_ttl_ms = 1500
        elif change == "key":
            it.key = rng.choice(["", "x" * 5000, "a\x00b"])
        elif change == "size":
            it.size = 0
        else:
            it.key = "ключ-é-" + it.key
    req = master_pb2.PutStartRequest.FromString(req.SerializeToString())
    assert _columns(put_request_columns(req)) == _columns(put_columns(req.items))


@pytest.mark.parametrize("n", [5, 40])  # one by one, and as columns
def test_a_size_past_int64_is_refused_typed_and_the_rest_placed(n: int) -> None:
    """A uint64 size of 2**63 or more (the field allows it) once raised OverflowError
    out of the batched path; it is the item's BadRequestError now."""
    from kvstore.errors import BadRequestError
    from kvstore.master.model import Endpoint
    from kvstore.master.service import put_request_columns

    from .conftest import FakeClock, make_state

    st = make_state(FakeClock())
    st.register_node("a", Endpoint("a:1", "h"), "i")
    st.mount_segment("a", "s", Tier.DRAM, 1 << 20)
    items = [master_pb2.PutStartItem(key=f"k{i}", size=100) for i in range(n)]
    items[3].size = (1 << 64) - 1
    res = st.put_start_columns("c", "a", put_request_columns(
        master_pb2.PutStartRequest(client_id="c", items=items)))  # fmt: skip
    assert isinstance(res.errors[3], BadRequestError) and "2**63" in str(res.errors[3])
    assert int((res.ids >= 0).sum()) == n - 1
    st.check_integrity()
