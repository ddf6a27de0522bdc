"""An HA pool (3 masters on a real etcd) in mTLS and in token mode: the leader runs the
same guard as a single master (authentication, the authorization table, tenants), so an
unauthenticated caller is refused, an authenticated client puts and gets, a client
credential cannot call an admin RPC, and no plaintext fast lane is opened."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from kvstore.client import Client
from kvstore.client.config import ClientConfig
from kvstore.errors import UnauthenticatedError, UnavailableError
from kvstore.security.config import SecurityConfig
from kvstore.v1 import master_pb2, master_pb2_grpc
from tests.ha.etcd import Etcd
from tests.security.helpers import Pki, SecureProcess, channel, code_of, start_master, start_node

pytestmark = pytest.mark.slow
DENIED, UNAUTH = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED


class SecurePool:
    """Three HA masters and a node, every process with its own credential."""

    def __init__(
        self,
        workdir: Path,
        etcd: Etcd,
        server: Callable[[int], SecurityConfig],
        node: SecurityConfig,
        admin: SecurityConfig,
    ) -> None:
        self.procs: list[SecureProcess] = []
        self.addresses: list[str] = []
        self.admin = admin
        for i in range(3):
            d = workdir / f"m{i}"
            d.mkdir()
            address, proc = start_master(
                d,
                server(i),
                "--etcd",
                etcd.endpoint,
                "--cluster-id",
                "pool-sec",
                "--etcd-prefix",
                "/kvs-sec",
                "--ha-lease-s",
                "2",
            )
            self.addresses.append(address)
            self.procs.append(proc)
        self.address = ",".join(self.addresses)
        self.leader = self.wait(lambda: self.find_leader())
        self.procs.append(start_node(workdir, self.address, node))
        self.wait(lambda: any(s.node_id == "n1" for s in self.stats().segments))

    def stub(self, i: int, sec: SecurityConfig | None) -> master_pb2_grpc.MasterStub:
        return master_pb2_grpc.MasterStub(channel(self.addresses[i], sec))

    def stats(self) -> master_pb2.StatsResponse:
        return self.stub(self.leader, self.admin).Stats(master_pb2.StatsRequest(), timeout=5)

    def find_leader(self) -> int | None:
        for i in range(len(self.addresses)):
            if (
                code_of(
                    lambda i=i: self.stub(i, self.admin).Stats(master_pb2.StatsRequest(), timeout=2)
                )
                == grpc.StatusCode.OK
            ):
                return i
        return None

    @staticmethod
    def wait(pred: Callable[[], object], timeout_s: float = 30.0) -> object:  # type: ignore[return]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                got = pred()
            except grpc.RpcError:
                got = None
            if got is not None and got is not False:
                return got
            time.sleep(0.1)  # polling other processes' state
        raise TimeoutError("condition not met")

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_pool(pki: Pki, etcd: Etcd, tmp_path: Path) -> Iterator[SecurePool]:
    pool = SecurePool(tmp_path, etcd, lambda i: pki.server(), pki.tls("n1"), pki.tls("ops"))
    yield pool
    pool.close()


@pytest.fixture
def token_pool(pki: Pki, etcd: Etcd, tmp_path: Path) -> Iterator[SecurePool]:
    server = SecurityConfig(
        mode="token", secret_file=str(pki.secret_file), token_file=str(pki.token_file("master"))
    )
    pool = SecurePool(
        tmp_path,
        etcd,
        lambda i: server,
        SecurityConfig(
            mode="token", secret_file=str(pki.secret_file), token_file=str(pki.token_file("n1"))
        ),
        pki.token_client("ops"),
    )
    yield pool
    pool.close()


def evict_code(stub: master_pb2_grpc.MasterStub) -> grpc.StatusCode:
    return code_of(lambda: stub.Evict(master_pb2.EvictRequest(prefix="alice/"), timeout=5))


def test_tls_ha_pool_refuses_the_unauthenticated_and_serves_the_authenticated(
    tls_pool: SecurePool, pki: Pki
) -> None:
    sec = pki.tls("alice-1")
    cfg = ClientConfig(
        master=tls_pool.addresses[0],
        masters=tuple(tls_pool.addresses),
        transport="tcp",
        ca_file=sec.ca_file,
        cert_file=sec.cert_file,
        key_file=sec.key_file,
    )
    with Client(cfg) as c:
        c.put("k", b"over mTLS to the HA leader")
        assert c.get("k") == b"over mTLS to the HA leader"
    assert tls_pool.stats().fast_lane == ""  # no plaintext side door on a secured leader
    page = tls_pool.stub(tls_pool.leader, pki.tls("ops")).ListObjects(
        master_pb2.ListObjectsRequest(prefix="alice/"), timeout=5
    )
    assert [o.key for o in page.objects] == ["alice/k"]  # in its tenant's namespace
    leader = tls_pool.leader
    plain = tls_pool.stub(leader, None)  # no certificate: the handshake fails
    assert code_of(lambda: plain.Stats(master_pb2.StatsRequest(), timeout=5)) == (
        grpc.StatusCode.UNAVAILABLE
    )
    revoked = tls_pool.stub(leader, pki.tls("revoked"))
    assert code_of(lambda: revoked.Stats(master_pb2.StatsRequest(), timeout=5)) == UNAUTH
    assert evict_code(tls_pool.stub(leader, sec)) == DENIED  # authz: admin only
    bob = tls_pool.stub(leader, pki.tls("bob-1"))
    remove = master_pb2.RemoveRequest(keys=["alice/k"])
    assert code_of(lambda: bob.Remove(remove, timeout=5)) == DENIED  # another tenant's key
    bare = ClientConfig(
        master=tls_pool.addresses[0],
        masters=tuple(tls_pool.addresses),
        transport="tcp",
        timeout_s=3,
        failover_timeout_s=3,
    )
    with pytest.raises((UnauthenticatedError, UnavailableError)), Client(bare) as c:
        c.put("x", b"y")
    assert tls_pool.stats().objects == 1


def test_token_ha_pool_refuses_the_unauthenticated_and_serves_the_authenticated(
    token_pool: SecurePool, pki: Pki
) -> None:
    leader = token_pool.leader
    nobody = grpc.secure_channel(token_pool.addresses[leader], grpc.local_channel_credentials())
    none = master_pb2_grpc.MasterStub(nobody)  # loopback passes, but it carries no token
    assert code_of(lambda: none.Stats(master_pb2.StatsRequest(), timeout=5)) == UNAUTH
    item = master_pb2.PutStartItem(key="alice/t", size=8)
    put = master_pb2.PutStartRequest(client_id="alice-1", items=[item])
    assert code_of(lambda: none.PutStart(put, timeout=5)) == UNAUTH
    alice = pki.token_client("alice-1")
    assert evict_code(token_pool.stub(leader, alice)) == DENIED
    cfg = ClientConfig(
        master=token_pool.addresses[0],
        masters=tuple(token_pool.addresses),
        transport="tcp",
        token_file=alice.token_file,
    )
    with Client(cfg) as c:
        c.put("t", b"over a token to the HA leader")
        assert c.get("t") == b"over a token to the HA leader"
    forged = token_pool.stub(leader, None)  # plaintext, no token
    assert code_of(lambda: forged.Stats(master_pb2.StatsRequest(), timeout=5)) == UNAUTH
    assert token_pool.stats().objects == 1
    nobody.close()
