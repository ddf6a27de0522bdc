"""Hand-built reply encodings equal upb's, byte for byte, for the same messages."""

from __future__ import annotations

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


def test_lookup_reply_from_put_start_cache_matches_upb() -> None:
    """PutStart caches each object's LookupResult; a later lookup serves exactly upb's."""
    import asyncio

    from kvstore.master.config import MasterConfig
    from kvstore.master.metadata import MasterState
    from kvstore.master.model import Endpoint
    from kvstore.master.service import MasterServicer

    state = MasterState(MasterConfig())
    for node in ("a", "b"):
        state.register_node(node, Endpoint())
        state.mount_segment(node, f"{node}-seg", Tier.DRAM, 1 << 20)
    svc = MasterServicer(state, "epoch")
    items = [
        master_pb2.PutStartItem(key="k1", size=100, replicas=2, group="g"),
        master_pb2.PutStartItem(key="k2", size=300),
    ]

    async def body() -> master_pb2.BatchLookupResponse:
        await svc.PutStart(master_pb2.PutStartRequest(client_id="c", items=items), None)
        await svc.PutEnd(master_pb2.PutEndRequest(client_id="c", keys=["k1", "k2"]), None)
        req = master_pb2.BatchLookupRequest(keys=["k1", "k2", "k3"])
        return await svc.BatchLookup(req, None)

    got = asyncio.run(body())
    objs = [state.objects["k1"], state.objects["k2"]]
    want = [
        master_pb2.LookupResult(
            status=_status(None), size=o.size, group=o.group,
            replicas=[to_pb_location(loc) for loc in o.replicas],
        )
        for o in objs
    ]  # fmt: skip
    assert [r.SerializeToString() for r in got.results[:2]] == [w.SerializeToString() for w in want]
    assert len(got.results[0].replicas) == 2 and got.results[0].group == "g"
    assert got.results[2].status.code == code_for(NotFoundError("x"))
