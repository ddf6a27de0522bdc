"""The master's authorization table (kvstore.security.authz), rule by rule, on a real
MasterState: each refused call raises its typed error before the servicer could run,
and the state is unchanged (same objects, same nodes, integrity holds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvstore.errors import BadRequestError, NotFoundError, PermissionDeniedError
from kvstore.master.config import MasterConfig
from kvstore.master.metadata import MasterState
from kvstore.master.model import Endpoint, PutItem
from kvstore.security import identity
from kvstore.security.authz import Answer
from kvstore.security.guard import MasterGuard
from kvstore.security.identity import Identity
from kvstore.types import Tier
from kvstore.v1 import common_pb2, master_pb2

ALICE = Identity("client", "alice-1", "alice")
BOB = Identity("client", "bob-1", "bob")
NODE = Identity("node", "n1")
ADMIN = Identity("admin", "ops")


@pytest.fixture
def guard() -> MasterGuard:
    st = MasterState(MasterConfig())
    st.register_node("n1", Endpoint("127.0.0.1:1"))
    st.mount_segment("n1", "s", Tier.DRAM, 1 << 20)
    st.put_start("alice-1", "", [PutItem("alice/k", 100)])
    st.put_end("alice-1", ["alice/k"])
    st.put_start("alice-1", "", [PutItem("alice/w", 100)])  # still being written
    return MasterGuard(st)


@pytest.fixture
def as_() -> Iterator[object]:
    tokens: list[object] = []

    def become(ident: Identity) -> None:
        tokens.append(identity.set_current(ident))

    yield become
    for t in reversed(tokens):
        identity.reset_current(t)


def snapshot(g: MasterGuard) -> tuple[object, ...]:
    st = g.state
    g.state.check_integrity()
    g.check_integrity()
    objs = {k: (o.state, o.writer, tuple(o.replicas), o.pin_until) for k, o in st.objects.items()}
    return objs, dict(st.registry.nodes), set(st.registry.segments), set(st.registry.cordoned)


def refused(
    g: MasterGuard, method: str, request: object, err: type = PermissionDeniedError
) -> None:
    before = snapshot(g)
    with pytest.raises(err):
        g.admit(method, request)
    assert snapshot(g) == before


ep = common_pb2.NodeEndpoint(tcp_address="127.0.0.1:6666")


@pytest.mark.parametrize("who", [ALICE, BOB, Identity("node", "n2"), ADMIN])
def test_node_rpcs_only_as_itself(guard, as_, who) -> None:  # type: ignore[no-untyped-def]
    as_(who)
    refused(guard, "RegisterNode", master_pb2.RegisterNodeRequest(node_id="n1", endpoint=ep))
    refused(guard, "Heartbeat", master_pb2.HeartbeatRequest(node_id="n1"))
    mount = master_pb2.MountSegmentRequest(node_id="n1", segment="x", tier=1, capacity=4096)
    refused(guard, "MountSegment", mount)
    refused(guard, "NodeTasks", master_pb2.NodeTasksRequest(node_id="n1"))
    refused(guard, "AnnounceObjects", master_pb2.AnnounceObjectsRequest(node_id="n1", segment="s"))


def test_node_acts_as_itself(guard, as_) -> None:  # type: ignore[no-untyped-def]
    as_(NODE)
    assert guard.admit("Heartbeat", master_pb2.HeartbeatRequest(node_id="n1")) is None
    as_(Identity("client", "lender"))  # a client lending a segment is the node of its id
    assert guard.admit("RegisterNode", master_pb2.RegisterNodeRequest(node_id="lender")) is None


def test_unmount_needs_the_node_or_admin(guard, as_) -> None:  # type: ignore[no-untyped-def]
    req = master_pb2.UnmountSegmentRequest(node_id="n1", segment="s")
    as_(ALICE)
    refused(guard, "UnmountSegment", req)
    as_(Identity("node", "n2"))
    refused(guard, "UnmountSegment", req)
    for ok in (NODE, ADMIN):
        as_(ok)
        assert guard.admit("UnmountSegment", req) is None


def test_only_the_writer_commits_or_revokes(guard, as_) -> None:  # type: ignore[no-untyped-def]
    as_(Identity("client", "alice-2", "alice"))  # same tenant, another writer
    refused(guard, "PutEnd", master_pb2.PutEndRequest(client_id="alice-1", keys=["alice/w"]))
    refused(guard, "PutRevoke", master_pb2.PutRevokeRequest(client_id="alice-1", keys=["alice/w"]))
    item = master_pb2.PutStartItem(key="alice/n", size=1)
    refused(guard, "PutStart", master_pb2.PutStartRequest(client_id="alice-1", items=[item]))
    as_(NODE)  # a node does not write objects
    refused(guard, "PutStart", master_pb2.PutStartRequest(client_id="n1", items=[item]))
    as_(ALICE)
    assert (
        guard.admit("PutEnd", master_pb2.PutEndRequest(client_id="alice-1", keys=["alice/w"]))
        is None
    )


def test_only_the_writer_or_admin_removes(guard, as_) -> None:  # type: ignore[no-untyped-def]
    as_(Identity("client", "alice-2", "alice"))  # same tenant, another writer
    refused(guard, "Remove", master_pb2.RemoveRequest(keys=["alice/k"]))
    refused(guard, "Remove", master_pb2.RemoveRequest(keys=["alice/gone", "alice/k"]))
    assert guard.admit("Remove", master_pb2.RemoveRequest(keys=["alice/gone"])) is None
    for who in (ALICE, ADMIN):
        as_(who)
        assert guard.admit("Remove", master_pb2.RemoveRequest(keys=["alice/k"])) is None


def test_writes_stay_in_the_tenant(guard, as_) -> None:  # type: ignore[no-untyped-def]
    as_(BOB)
    for key, group in (("alice/x", ""), ("bob/x", "alice/g"), ("x", "")):
        item = master_pb2.PutStartItem(key=key, size=1, group=group)
        refused(guard, "PutStart", master_pb2.PutStartRequest(client_id="bob-1", items=[item]))
    refused(guard, "PutRevoke", master_pb2.PutRevokeRequest(client_id="bob-1", keys=["alice/w"]))
    refused(guard, "Remove", master_pb2.RemoveRequest(keys=["alice/k"]))
    commit = master_pb2.CommitExtentRequest(
        client_id="bob-1", items=[master_pb2.CommitItem(key="alice/x", size=1)]
    )
    refused(guard, "CommitExtent", commit)


def test_admin_rpcs(guard, as_) -> None:  # type: ignore[no-untyped-def]
    reqs = {
        "Pin": master_pb2.PinRequest(keys=["alice/k"], ttl_ms=3_600_000),
        "Unpin": master_pb2.UnpinRequest(keys=["alice/k"]),
        "Evict": master_pb2.EvictRequest(keys=["alice/k"], force=True),
        "Cordon": master_pb2.CordonRequest(node_id="n1", cordon=True),
        "SomeFutureRpc": master_pb2.StatsRequest(),  # not in the table: admin only
    }
    for who in (ALICE, NODE):
        as_(who)
        for method, req in reqs.items():
            refused(guard, method, req)
        refused(guard, "Remove", master_pb2.RemoveRequest(keys=["alice/k"], force=True))
    as_(ADMIN)
    for method, req in reqs.items():
        assert guard.admit(method, req) is None


def test_reader_id_is_the_credential(guard, as_) -> None:  # type: ignore[no-untyped-def]
    as_(BOB)
    refused(guard, "BatchLookup", master_pb2.BatchLookupRequest(keys=["bob/a"], client_id="a-1"))
    refused(guard, "Remove", master_pb2.RemoveRequest(keys=["bob/a"], client_id="alice-1"))


def test_another_tenant_reads_as_a_miss(guard, as_) -> None:  # type: ignore[no-untyped-def]
    as_(BOB)
    req = master_pb2.BatchLookupRequest(keys=["bob/a", "alice/k", "alice/none"])
    post = guard.admit("BatchLookup", req)
    assert list(req.keys) == ["bob/a"] and post is not None
    reply = post(master_pb2.BatchLookupResponse(results=[master_pb2.LookupResult()]))
    real_miss = guard.state.peek(["alice/none"])[0]
    assert isinstance(real_miss, NotFoundError)
    for r, key in zip(reply.results[1:], ["alice/k", "alice/none"], strict=True):
        assert r.status.code == common_pb2.ERROR_CODE_NOT_FOUND
        assert (
            r.status.message == f"unknown key {key!r}" == str(NotFoundError(f"unknown key {key!r}"))
        )
    assert str(real_miss) == reply.results[2].status.message  # worded as the core words it
    match = master_pb2.MatchPrefixRequest(keys=["bob/a", "alice/k", "bob/b"])
    guard.admit("MatchPrefix", match)
    assert list(match.keys) == ["bob/a"]  # a miss ends every prefix
    with pytest.raises(NotFoundError, match="unknown key 'alice/k'"):
        guard.admit("Inspect", master_pb2.InspectRequest(key="alice/k"))
    with pytest.raises(Answer):
        guard.admit("ListObjects", master_pb2.ListObjectsRequest(prefix="alice/"))
    listing = master_pb2.ListObjectsRequest(prefix="")
    guard.admit("ListObjects", listing)
    assert listing.prefix == "bob/"


def test_cached_reads_count_only_in_the_tenant(guard, as_) -> None:  # type: ignore[no-untyped-def]
    """Reads a client served from its location cache, reported with a lookup, move hit
    counters and promotion: another tenant's keys are dropped from the report; the
    reply keeps promote_after and its `moving` indices point at the caller's keys."""
    as_(BOB)
    req = master_pb2.BatchLookupRequest(
        keys=["alice/k", "bob/a", "bob/b"],
        cached_keys=["alice/k", "bob/a", "alice/w"],
        cached_reads=[5, 2, 1],
    )
    post = guard.admit("BatchLookup", req)
    assert list(req.cached_keys) == ["bob/a"] and list(req.cached_reads) == [2]
    assert list(req.keys) == ["bob/a", "bob/b"] and post is not None
    inner = master_pb2.BatchLookupResponse(
        results=[master_pb2.LookupResult(), master_pb2.LookupResult()],
        lease_ttl_ms=500, promote_after=2, moving=[1],
    )  # fmt: skip
    reply = post(inner)
    assert reply.promote_after == 2 and reply.lease_ttl_ms == 500
    assert list(reply.moving) == [2]  # "bob/b", the caller's third key
    refused(
        guard, "BatchLookup",
        master_pb2.BatchLookupRequest(keys=["bob/a"], cached_keys=["bob/a"], cached_reads=[]),
        BadRequestError,
    )  # fmt: skip


def test_a_client_without_tenant_is_in_default(guard, as_) -> None:  # type: ignore[no-untyped-def]
    as_(Identity("client", "plain-1"))
    listing = master_pb2.ListObjectsRequest(prefix="")
    guard.admit("ListObjects", listing)
    assert listing.prefix == "default/"
    req = master_pb2.BatchLookupRequest(keys=["alice/k"])
    post = guard.admit("BatchLookup", req)
    assert list(req.keys) == [] and post is not None


def test_insecure_identity_passes_every_rule(guard) -> None:  # type: ignore[no-untyped-def]
    assert identity.current() is identity.INSECURE
    assert guard.admit("Pin", master_pb2.PinRequest(keys=["alice/k"])) is None
    assert guard.admit("RegisterNode", master_pb2.RegisterNodeRequest(node_id="n1")) is None


def test_every_master_rpc_has_a_rule() -> None:
    """A new RPC is admin-only until the table names it (fail closed); this asks whoever
    adds one to decide who may call it (kvstore/security/authz.py RULES)."""
    from kvstore.security.authz import RULES

    service = master_pb2.DESCRIPTOR.services_by_name["Master"]
    missing = {m.name for m in service.methods} - set(RULES)
    assert not missing, f"no authorization rule for {sorted(missing)}"
