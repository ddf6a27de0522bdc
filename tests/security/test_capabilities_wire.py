"""The master's replies carry capabilities (issue 10, point 2): in secured mode every
PutStart location and leased BatchLookup replica, encoded for a whole batch from the
object table (kvstore.master.wire, numpy and key by key), carries a capability for
exactly its range and mode, which its node verifies; the bytes are upb's for the same
message; insecure mode carries none."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from kvstore.edge import to_pb_location
from kvstore.errors import PermissionDeniedError
from kvstore.master import wire
from kvstore.master.config import MasterConfig
from kvstore.master.metadata import MasterState
from kvstore.master.model import Endpoint
from kvstore.master.service import MasterServicer
from kvstore.security.capabilities import READ, WRITE, Issuer, Keyring
from kvstore.types import Tier
from kvstore.v1 import master_pb2

NODES = ("a", "b", "ü")


def servicer(secured: bool) -> tuple[MasterState, MasterServicer, dict[str, Keyring]]:
    state = MasterState(MasterConfig())
    svc = MasterServicer(state, "epoch")
    svc.caps = Issuer() if secured else None
    rings = {}
    for node in NODES:
        state.register_node(node, Endpoint())
        state.mount_segment(node, f"{node}-seg", Tier.DRAM, 1 << 40)
        if svc.caps is not None:
            key = svc.caps.rotate(node)  # as RegisterNode does
            rings[node] = Keyring(node)
            rings[node].install(key.secret, key.key_id, key.clock_ms, time.monotonic())
    state.mount_segment("a", "a-hbm", Tier.HBM, 1 << 20)
    return state, svc, rings


def run(svc: MasterServicer, items: list[master_pb2.PutStartItem]) -> tuple[
    master_pb2.PutStartResponse, master_pb2.BatchLookupResponse, master_pb2.BatchLookupResponse
]:  # fmt: skip
    keys = [it.key for it in items]

    async def body() -> tuple[
        master_pb2.PutStartResponse, master_pb2.BatchLookupResponse,
        master_pb2.BatchLookupResponse,
    ]:  # fmt: skip
        put = await svc.PutStart(master_pb2.PutStartRequest(client_id="c", items=items), None)
        await svc.PutEnd(master_pb2.PutEndRequest(client_id="c", keys=keys), None)
        leased = master_pb2.BatchLookupRequest(keys=["nope", *keys], lease_ttl_ms=2000)
        query = master_pb2.BatchLookupRequest(keys=keys, no_lease=True)
        return put, await svc.BatchLookup(leased, None), await svc.BatchLookup(query, None)

    return asyncio.run(body())


ITEMS = [
    master_pb2.PutStartItem(key="k1", size=100, replicas=2, group="g"),
    master_pb2.PutStartItem(key="k2", size=(1 << 33) + 7),
    master_pb2.PutStartItem(key="k3", size=1, tier=0),  # HBM
    *(master_pb2.PutStartItem(key=f"r{i}", size=4096 * (i + 1)) for i in range(40)),
]


@pytest.mark.parametrize("small", [0, 10**6])
def test_replies_carry_a_capability_per_location(
    small: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvstore.master import batch

    monkeypatch.setattr(batch, "SMALL", small)  # 0: numpy for every batch; big: key by key
    monkeypatch.setattr(wire, "SMALL_BATCH", small)
    state, svc, rings = servicer(secured=True)
    put, leased, query = run(svc, ITEMS)
    placed = 0
    for it, r in zip(ITEMS, put.results, strict=True):
        assert r.status.code == 0, r.status.message
        want = master_pb2.PutStartResult(status=r.status)
        for loc, replica in zip(r.locations, state.objects[it.key].replicas, strict=True):
            ring = rings[loc.node_id]
            ring.check(loc.segment, loc.offset, loc.length, WRITE, loc.capability)
            with pytest.raises(PermissionDeniedError):  # not a READ, not a byte more
                ring.check(loc.segment, loc.offset, loc.length, READ, loc.capability)
            with pytest.raises(PermissionDeniedError):
                ring.check(loc.segment, loc.offset, loc.length + 1, WRITE, loc.capability)
            pb = to_pb_location(replica)
            pb.capability = loc.capability
            want.locations.append(pb)
            placed += 1
        assert r.SerializeToString() == want.SerializeToString()  # upb's bytes
    assert placed == len(ITEMS) + 1  # k1 has two replicas
    assert leased.results[0].status.code != 0
    for it, r in zip(ITEMS, leased.results[1:], strict=True):
        assert len(r.replicas) == len(state.objects[it.key].replicas)
        for loc in r.replicas:
            rings[loc.node_id].check(loc.segment, loc.offset, loc.length, READ, loc.capability)
            with pytest.raises(PermissionDeniedError):
                rings[loc.node_id].check(loc.segment, loc.offset, loc.length, WRITE,
                                         loc.capability)  # fmt: skip
            other = "b" if loc.node_id == "a" else "a"  # another node refuses it
            with pytest.raises(PermissionDeniedError):
                rings[other].check(loc.segment, loc.offset, loc.length, READ, loc.capability)
    for r in query.results:  # a pure query (no lease) grants nothing
        assert all(loc.capability == b"" for loc in r.replicas)


@pytest.mark.parametrize("small", [0, 10**6])
def test_insecure_replies_carry_none(small: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstore.master import batch

    monkeypatch.setattr(batch, "SMALL", small)
    monkeypatch.setattr(wire, "SMALL_BATCH", small)
    _, svc, _ = servicer(secured=False)
    put, leased, _ = run(svc, ITEMS)
    assert all(loc.capability == b"" for r in put.results for loc in r.locations)
    assert all(loc.capability == b"" for r in leased.results for loc in r.replicas)


def test_hot_keys_reuse_their_grant_until_a_new_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reply cache (numpy path): a second lookup within the quantum reuses each
    row's capability byte for byte; a node's new key makes its rows get fresh ones."""
    from kvstore.master import batch

    monkeypatch.setattr(batch, "SMALL", 0)
    monkeypatch.setattr(wire, "SMALL_BATCH", 0)
    _, svc, rings = servicer(secured=True)
    items = [master_pb2.PutStartItem(key=f"h{i}", size=512) for i in range(64)]
    _, first, _ = run(svc, items)
    keys = [it.key for it in items]

    def lookup() -> master_pb2.BatchLookupResponse:
        req = master_pb2.BatchLookupRequest(keys=keys, lease_ttl_ms=2000)
        return asyncio.run(svc.BatchLookup(req, None))

    hits = svc.cap_cache.hits
    again = lookup()
    caps = [r.replicas[0].capability for r in again.results]
    assert caps == [r.replicas[0].capability for r in first.results[1:]] or (
        svc.cap_cache.hits == hits  # the quantum turned between the two lookups
    )
    assert svc.cap_cache.hits > hits or len(set(caps)) == len(caps)
    assert svc.caps is not None
    key = svc.caps.rotate("a")  # node a registered again
    rings["a"].install(key.secret, key.key_id, key.clock_ms, time.monotonic())
    for r in lookup().results:
        loc = r.replicas[0]
        rings[loc.node_id].check(loc.segment, loc.offset, loc.length, READ, loc.capability)
    assert len(set(caps)) == len(caps)  # one grant per range, never shared


@pytest.mark.parametrize("group", [0, 10**6])  # MACs by segment / row by row
def test_cached_fields_are_fresh_ones_and_miss_after_any_change(
    group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reply cache keeps each row's encoded capability field and checks it once per
    reply (an epoch): its replies are byte for byte those minted afresh while the
    quantum holds; the quantum's roll, a node's new key (or none), another segment in a
    slot and a moved row each make the affected fields fresh ones, never the old."""
    from kvstore.master import batch

    monkeypatch.setattr(batch, "SMALL", 0)
    monkeypatch.setattr(wire, "SMALL_BATCH", 0)
    monkeypatch.setattr(wire, "MAC_GROUP", group)
    now = [100.0]
    state, svc, _ = servicer(secured=True)
    issuer = Issuer(clock=lambda: now[0])
    for node in NODES:
        issuer.rotate(node)
    svc.caps = issuer
    items = [
        master_pb2.PutStartItem(key=f"c{i}", size=512 * (i + 1), preferred_node=NODES[i % 3])
        for i in range(60)
    ]
    items.append(master_pb2.PutStartItem(key="two", size=64, replicas=2))  # encoded alone
    run(svc, items)
    table, cache = state.objects, wire.CapabilityCache()
    keys = ["nope", *(it.key for it in items)]

    def check(reused: bool) -> master_pb2.BatchLookupResponse:
        """The cached reply: the fresh one byte for byte, its fields all reused from the
        last reply (`reused`) or some of them minted."""
        hits, misses = cache.hits, cache.misses
        mint = issuer.minter(READ, 2.0, 500)
        assert mint is not None
        res = state.peek_rows(keys)
        got = wire.lookup_results(table, res, svc.locations, mint, cache)
        assert got == wire.lookup_results(table, res, svc.locations, mint)  # fresh grants
        if reused:
            assert cache.misses == misses and cache.hits > hits
        else:
            assert cache.misses > misses
        return master_pb2.BatchLookupResponse.FromString(got)

    def caps(reply: master_pb2.BatchLookupResponse, node: str, seg: str = "") -> list[bytes]:
        return [
            loc.capability for r in reply.results for loc in r.replicas
            if loc.node_id == node and loc.segment.startswith(seg)
        ]  # fmt: skip

    first = check(reused=False)
    assert all(caps(first, n) for n in NODES)
    assert check(reused=True) == first  # within the quantum: every field reused
    now[0] += 0.5  # the quantum rolls: a new expiry for all
    rolled = check(reused=False)
    assert all(set(caps(rolled, n)).isdisjoint(caps(first, n)) for n in NODES)
    check(reused=True)
    issuer.rotate("a")  # a registered again: its rows' fields are of its new key
    rotated = check(reused=False)
    assert set(caps(rotated, "a")).isdisjoint(caps(rolled, "a"))
    assert caps(rotated, "b") == caps(rolled, "b")
    check(reused=True)
    issuer.forget("b")  # b has no key: its rows carry none
    assert set(caps(check(reused=False), "b")) == {b""}
    check(reused=True)
    issuer.rotate("b")
    check(reused=False)
    check(reused=True)
    row = table.index.find("c6")  # on node a
    slot = int(table.col["seg"][row])
    old = table.segments[slot].name
    table.segments[slot] = dataclasses.replace(table.segments[slot], name="a-new")
    renamed = check(reused=False)  # another segment in a's slot: its grants name it
    assert caps(renamed, "a", "a-new")
    assert set(caps(renamed, "a", "a-new")).isdisjoint(caps(rotated, "a", old))
    check(reused=True)
    table.col["offset"][row] += 4096  # the row moved within its segment
    misses = cache.misses
    check(reused=False)
    assert cache.misses == misses + 1  # that row only
    check(reused=True)
    table.col["seg"][row] = next(s for s in table.segments if s != slot)  # to another one
    check(reused=False)
    assert cache.misses == misses + 2
    check(reused=True)
