"""mTLS and token modes end to end, with a real master and storage node process each
(issue 10, points 1-3): a client puts and gets through them; a caller with a wrong-CA,
expired, revoked or missing certificate (or a bad, expired or missing token) is refused;
the node-hijack, cross-tenant and other-writer probes fail with a typed status and
change nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kvstore.client import Client
from kvstore.client.config import ClientConfig
from kvstore.errors import NotFoundError, UnauthenticatedError
from kvstore.security.config import SecurityConfig
from kvstore.v1 import common_pb2, master_pb2, master_pb2_grpc
from tests.security.helpers import Pki, SecureProcess, channel, code_of, start_master, start_node

pytestmark = pytest.mark.slow
DENIED, UNAUTH = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED


def wait_for(pred, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except grpc.RpcError:
            pass
        time.sleep(0.1)  # polling another process's state
    raise TimeoutError("condition not met")


class Pool:
    """A secured master and one node (n1), plus stubs per credential."""

    def __init__(self, workdir: Path, pki: Pki, server: SecurityConfig, node: SecurityConfig,
                 admin: SecurityConfig) -> None:  # fmt: skip
        self.pki = pki
        self.address, self.master = start_master(workdir, server)
        self.node: SecureProcess = start_node(workdir, self.address, node)
        self.admin = self.stub(admin)
        wait_for(lambda: any(s.node_id == "n1" for s in self.stats().segments))

    def stub(self, sec: SecurityConfig | None) -> master_pb2_grpc.MasterStub:
        return master_pb2_grpc.MasterStub(channel(self.address, sec))

    def stats(self) -> master_pb2.StatsResponse:
        return self.admin.Stats(master_pb2.StatsRequest(), timeout=5)

    def close(self) -> None:
        self.node.stop()
        self.master.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_pool(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    pool = Pool(tmp_path_factory.mktemp("tls"), pki, pki.server(), pki.tls("n1"), pki.tls("ops"))
    yield pool
    pool.close()


def client(pool: Pool, name: str, **kw: object) -> Client:
    sec = pool.pki.tls(name)
    cfg = ClientConfig(master=pool.address, transport="tcp", ca_file=sec.ca_file,
                       cert_file=sec.cert_file, key_file=sec.key_file, **kw)  # type: ignore[arg-type]  # fmt: skip
    return Client(cfg)


def test_tls_put_get_and_the_identity_from_the_certificate(tls_pool: Pool) -> None:
    with client(tls_pool, "alice-1") as c:
        assert c.config.client_id == "alice-1" and c.config.tenant == "alice"
        c.put("k", b"hello over mTLS")
        assert c.get("k") == b"hello over mTLS"
    stats = tls_pool.stats()
    assert stats.fast_lane == ""  # no plaintext side door on a secured master
    page = tls_pool.admin.ListObjects(master_pb2.ListObjectsRequest(prefix="alice/"))
    assert [o.key for o in page.objects] == ["alice/k"]


def test_bad_certificates_are_refused(tls_pool: Pool) -> None:
    pki = tls_pool.pki
    before = tls_pool.stats()
    probes = {
        "wrong CA": pki.tls("alice-1", ca_dir=pki.other),
        "expired": pki.tls("expired"),
    }
    for why, sec in probes.items():
        assert (
            code_of(lambda s=sec: tls_pool.stub(s).Stats(master_pb2.StatsRequest(), timeout=5))
            == grpc.StatusCode.UNAVAILABLE
        ), why  # the TLS handshake fails
    assert (
        code_of(lambda: tls_pool.stub(None).Stats(master_pb2.StatsRequest(), timeout=5))
        == grpc.StatusCode.UNAVAILABLE
    )  # no certificate at all (plaintext)
    revoked = tls_pool.stub(pki.tls("revoked"))
    assert code_of(lambda: revoked.Stats(master_pb2.StatsRequest(), timeout=5)) == UNAUTH
    item = master_pb2.PutStartItem(key="alice/r", size=1)
    put = master_pb2.PutStartRequest(client_id="alice-1", items=[item])
    assert code_of(lambda: revoked.PutStart(put, timeout=5)) == UNAUTH
    with pytest.raises(UnauthenticatedError), client(tls_pool, "revoked") as c:
        c.put("r", b"x")
    after = tls_pool.stats()
    assert (after.objects, after.writing) == (before.objects, before.writing)


def test_node_hijack_is_refused(tls_pool: Pool) -> None:
    pki = tls_pool.pki
    before = [(n.node_id, n.endpoint) for n in tls_pool.stats().nodes]
    evil = common_pb2.NodeEndpoint(tcp_address="127.0.0.1:1", shm_host_id="evil")
    for who in ("alice-1", "n2", "ops"):
        stub = tls_pool.stub(pki.tls(who))
        req = master_pb2.RegisterNodeRequest(node_id="n1", endpoint=evil, incarnation="x")
        assert code_of(lambda s=stub, r=req: s.RegisterNode(r, timeout=5)) == DENIED, who
        mount = master_pb2.MountSegmentRequest(
            node_id="n1", segment="evil", tier=1, capacity=1 << 30
        )
        assert code_of(lambda s=stub, r=mount: s.MountSegment(r, timeout=5)) == DENIED, who
    for who in ("alice-1", "n2"):
        stub = tls_pool.stub(pki.tls(who))
        seg = next(s.segment for s in tls_pool.stats().segments if s.node_id == "n1")
        unmount = master_pb2.UnmountSegmentRequest(node_id="n1", segment=seg)
        assert code_of(lambda s=stub, r=unmount: s.UnmountSegment(r, timeout=5)) == DENIED
    assert [(n.node_id, n.endpoint) for n in tls_pool.stats().nodes] == before


def test_tenants_and_writers(tls_pool: Pool) -> None:
    pki = tls_pool.pki
    with client(tls_pool, "alice-1") as alice:
        alice.put("secret", b"alice's bytes")
        for other in ("bob-1", "plain-1"):  # another tenant, and a client naming none
            with client(tls_pool, other) as c:
                assert not c.exists("secret") and c.size_of("secret") is None
                with pytest.raises(NotFoundError):
                    c.get("secret")
                raw = tls_pool.stub(pki.tls(other))
                look = raw.BatchLookup(master_pb2.BatchLookupRequest(
                    keys=["alice/secret", "alice/never-written"]))  # fmt: skip
                hit, miss = look.results
                assert hit.status.code == miss.status.code == common_pb2.ERROR_CODE_NOT_FOUND
                assert hit.status.message == "unknown key 'alice/secret'"  # as a real miss
                assert list(hit.replicas) == [] and hit.size == 0
                listing = raw.ListObjects(master_pb2.ListObjectsRequest(prefix="alice/"))
                assert list(listing.objects) == []
                everything = raw.ListObjects(master_pb2.ListObjectsRequest())
                assert all(not o.key.startswith("alice/") for o in everything.objects)
                match = raw.MatchPrefix(master_pb2.MatchPrefixRequest(keys=["alice/secret"]))
                assert match.pool_length == 0
                for call in (
                    lambda s=raw: s.Remove(master_pb2.RemoveRequest(keys=["alice/secret"])),
                    lambda s=raw: s.Pin(
                        master_pb2.PinRequest(keys=["alice/secret"], ttl_ms=3_600_000)
                    ),
                    lambda s=raw: s.Evict(master_pb2.EvictRequest(prefix="alice/")),
                ):
                    assert code_of(call) == DENIED
                assert c.remove("alice/secret") is False  # its own "T/alice/secret"
        assert alice.get("secret") == b"alice's bytes"  # unchanged by every probe


def test_only_the_writer_commits_or_revokes(tls_pool: Pool) -> None:
    pki = tls_pool.pki
    writer = tls_pool.stub(pki.tls("alice-1"))
    item = master_pb2.PutStartItem(key="alice/pending", size=16)
    assert (
        writer.PutStart(master_pb2.PutStartRequest(client_id="alice-1", items=[item]))
        .results[0]
        .status.code
        == 0
    )
    mate = tls_pool.stub(pki.tls("alice-2"))  # same tenant, another writer
    for req in (master_pb2.PutEndRequest(client_id="alice-1", keys=["alice/pending"]),
                master_pb2.PutEndRequest(client_id="alice-2", keys=["alice/pending"])):  # fmt: skip
        code = code_of(lambda r=req: mate.PutEnd(r))
        if req.client_id == "alice-1":
            assert code == DENIED  # naming the writer does not make one the writer
        else:
            got = mate.PutEnd(req).results[0]
            assert got.code == common_pb2.ERROR_CODE_ALREADY_EXISTS  # not its put
    revoke = master_pb2.PutRevokeRequest(client_id="alice-1", keys=["alice/pending"])
    assert code_of(lambda: mate.PutRevoke(revoke)) == DENIED
    assert (
        writer.PutEnd(master_pb2.PutEndRequest(client_id="alice-1", keys=["alice/pending"]))
        .results[0]
        .code
        == 0
    )


# ---- token mode ------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_pool(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    pool = Pool(tmp_path_factory.mktemp("token"), pki, pki.token_server(),
                pki.token_client("n1"), pki.token_client("ops"))  # fmt: skip
    yield pool
    pool.close()


def test_token_put_get_and_refusals(token_pool: Pool, pki: Pki) -> None:
    cfg = ClientConfig(master=token_pool.address, transport="tcp",
                       token_file=str(pki.token_file("alice-1")))  # fmt: skip
    assert cfg.client_id == "alice-1" and cfg.tenant == "alice"
    with Client(cfg) as c:
        c.put("t", b"over a token")
        assert c.get("t") == b"over a token"
    bad = pki.dir / "bad.token"
    forged = pki.token("ops")[:-4] + "AAAA"
    expired = pki.token("ops", ttl_s=1, now=time.time() - 10)
    for text in (forged, expired, "kvs1.e30.e30", "not a token"):
        bad.write_text(text)
        stub = token_pool.stub(SecurityConfig(mode="token", token_file=str(bad)))
        assert code_of(lambda s=stub: s.Stats(master_pb2.StatsRequest(), timeout=5)) == UNAUTH
    plain = token_pool.stub(None)  # plaintext: loopback passes, but it carries no token
    assert code_of(lambda: plain.Stats(master_pb2.StatsRequest(), timeout=5)) == UNAUTH
    nobody = grpc.secure_channel(token_pool.address, grpc.local_channel_credentials())
    stub = master_pb2_grpc.MasterStub(nobody)
    assert code_of(lambda: stub.Stats(master_pb2.StatsRequest(), timeout=5)) == UNAUTH
    hijack = token_pool.stub(pki.token_client("alice-1"))
    req = master_pb2.RegisterNodeRequest(node_id="n1", endpoint=common_pb2.NodeEndpoint())
    assert code_of(lambda: hijack.RegisterNode(req)) == DENIED
