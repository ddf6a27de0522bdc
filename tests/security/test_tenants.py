"""Per-tenant quotas at PutStart (issue 10, point 3): a tenant over its quota gets
RESOURCE_EXHAUSTED naming the quota, nothing is placed, other tenants are unaffected,
and space freed counts again at once; the master's usage counts always equal a recount of
the objects."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from kvstore.v1 import common_pb2, master_pb2
from tests.security.helpers import InProcessMaster, Pki

MIB = 1 << 20


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def master(pki: Pki) -> Iterator[InProcessMaster]:
    quotas = (("alice", 1000),)
    with InProcessMaster(pki.server(), tenant_quotas=quotas, tenant_quota_bytes=5000,
                         node_ttl_s=3600, heartbeat_interval_s=1) as m:  # fmt: skip
        for node in ("n1", "n2"):
            stub = m.stub(pki.tls(node))
            ep = common_pb2.NodeEndpoint(tcp_address="127.0.0.1:1")
            stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id=node, endpoint=ep))
            stub.MountSegment(
                master_pb2.MountSegmentRequest(node_id=node, segment="s", tier=1, capacity=MIB)
            )
        yield m


def put(stub, who: str, *items: tuple[str, int, int]) -> master_pb2.PutStartResponse:  # type: ignore[no-untyped-def]
    req = master_pb2.PutStartRequest(client_id=who, items=[
        master_pb2.PutStartItem(key=k, size=size, replicas=r) for k, size, r in items
    ])  # fmt: skip
    reply = stub.PutStart(req)
    keys = [k for k, _, _ in items]
    stub.PutEnd(master_pb2.PutEndRequest(client_id=who, keys=keys))
    return reply


def test_quota_refuses_with_the_quota_in_the_message(master: InProcessMaster, pki: Pki) -> None:
    alice = master.stub(pki.tls("alice-1"))
    put(alice, "alice-1", ("alice/a", 300, 2))  # 600 bytes: two replicas count twice
    before = master.on_loop(lambda: set(master.handle.state.objects))
    with pytest.raises(grpc.RpcError) as err:
        put(alice, "alice-1", ("alice/b", 300, 1), ("alice/c", 200, 1))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tenant 'alice' over its quota of 1000 bytes: holds 600" in err.value.details()
    assert master.on_loop(lambda: set(master.handle.state.objects)) == before
    put(alice, "alice-1", ("alice/b", 400, 1))  # exactly up to the quota
    bob = master.stub(pki.tls("bob-1"))  # the default quota, untouched by alice's use
    put(bob, "bob-1", ("bob/a", 4000, 1))
    with pytest.raises(grpc.RpcError) as err:
        put(bob, "bob-1", ("bob/b", 1001, 1))
    assert "quota of 5000 bytes" in err.value.details()
    master.check()


def test_freed_space_counts_again(master: InProcessMaster, pki: Pki) -> None:
    alice = master.stub(pki.tls("alice-1"))
    put(alice, "alice-1", ("alice/x", 900, 1))
    assert alice.Remove(master_pb2.RemoveRequest(keys=["alice/x"])).results[0].code == 0
    put(alice, "alice-1", ("alice/y", 900, 1))
    master.check()
    ledger = master.guard.ledger
    assert master.on_loop(lambda: ledger.tenant_bytes["alice"]) == 900


def test_extents_count_against_the_quota(master: InProcessMaster, pki: Pki) -> None:
    alice = master.stub(pki.tls("alice-1"))
    grant = master_pb2.GrantExtentRequest(client_id="alice-1", size=4096, min_size=4096)
    with pytest.raises(grpc.RpcError) as err:
        alice.GrantExtent(grant)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "quota of 1000" in err.value.details()
