"""Capabilities end to end (issue 10, point 2): a secured master, a secured storage node
and clients, all real (gRPC over mTLS or tokens, the TCP data plane over TLS, shared
memory by fd): puts and gets work over TCP and shm; the capabilities they carry are
exactly their ranges; a raw socket, a capability of another object, one replayed after
its lease, and an fd request without one are all refused."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvstore.client import Client
from kvstore.client.config import ClientConfig
from kvstore.node.config import NodeConfig
from kvstore.node.node import StorageNode
from kvstore.security.capabilities import Capability
from kvstore.security.config import SecurityConfig
from kvstore.security.credentials import data_plane_client
from kvstore.tiers.shm import fetch_fd
from kvstore.transfer import wire
from kvstore.transfer.base import TransferOp
from kvstore.v1 import master_pb2
from tests.security.helpers import InProcessMaster, Pki

pytestmark = pytest.mark.slow
MIB = 1 << 20


@dataclass
class Pool:
    master: InProcessMaster
    node: StorageNode
    pki: Pki
    mode: str

    def client(self, name: str, transport: str, **kw: object) -> Client:
        if self.mode == "tls":
            sec = self.pki.tls(name)
            files = {"ca_file": sec.ca_file, "cert_file": sec.cert_file, "key_file": sec.key_file}
        else:
            files = {"token_file": str(self.pki.token_file(name))}
        cfg = ClientConfig(master=self.master.address, transport=transport, **files, **kw)  # type: ignore[arg-type]
        return Client(cfg)

    def creds(self, name: str) -> SecurityConfig:
        return self.pki.tls(name) if self.mode == "tls" else self.pki.token_client(name)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module", params=["tls", "token"])
def pool(request: pytest.FixtureRequest, pki: Pki) -> Iterator[Pool]:
    mode = request.param
    server = pki.server() if mode == "tls" else pki.token_server()
    with InProcessMaster(server, heartbeat_interval_s=0.2) as master:
        if mode == "tls":
            sec = pki.tls("n1")
            files = {"ca_file": sec.ca_file, "cert_file": sec.cert_file, "key_file": sec.key_file}
        else:
            files = {"token_file": str(pki.token_file("n1"))}
        node = StorageNode(NodeConfig(master=master.address, dram_bytes=8 * MIB, **files))  # type: ignore[arg-type]
        node.start()
        try:
            yield Pool(master, node, pki, mode)
        finally:
            node.stop()


def endpoint(node: StorageNode) -> tuple[str, int]:
    host, port = node.endpoint.rsplit(":", 1)
    return host, int(port)


def test_secured_put_get_over_tcp_and_shm(pool: Pool) -> None:
    assert pool.node.keyring is not None and pool.node.keyring.ready
    assert (pool.node.server.tls is not None) == (pool.mode == "tls")
    refused = pool.node.keyring.refused
    value = bytes(range(256)) * 4096  # 1 MiB
    small = b"s" * 1000
    for transport in ("tcp", "shm"):
        with pool.client("alice-1", transport) as c:
            c.put(f"big-{transport}", value)  # PutStart: WRITE capabilities
            c.put(f"small-{transport}", small)  # an extent: its WRITE capability
            assert c.get(f"big-{transport}") == value  # leased lookup: READ capabilities
            assert c.get(f"small-{transport}") == small
            assert c.get(f"big-{transport}") == value  # from the location cache
    with pool.client("alice-2", "tcp") as c:  # another client, across transports
        assert c.get("big-shm") == value and c.get("small-tcp") == small
    assert pool.node.keyring.refused == refused  # granted traffic is never refused


def _looked_up(pool: Pool, key: str) -> master_pb2.LookupResult:
    stub = pool.master.stub(pool.creds("alice-1"))
    reply = stub.BatchLookup(
        master_pb2.BatchLookupRequest(keys=[f"alice/{key}"], lease_ttl_ms=300,
                                      client_id="alice-1"), timeout=5,
    )  # fmt: skip
    res = reply.results[0]
    assert res.status.code == 0, res.status.message
    return res


def _raw(pool: Pool, op: int, seg: str, offset: int, length: int, cap: bytes = b"",
         payload: bytes = b"") -> tuple[int, bytes]:  # fmt: skip
    sock = socket.create_connection(endpoint(pool.node), timeout=5)
    if pool.mode == "tls":
        tls = data_plane_client(pool.pki.tls("bob-1"))  # a credential of the pool's CA
        assert tls is not None
        sock = tls.wrap_socket(sock, server_hostname=endpoint(pool.node)[0])
    with sock:
        sock.sendall(wire.pack_request(op, 3, seg.encode(), offset, length, cap) + payload)
        status, _, n = wire.RESPONSE.unpack(wire.recv_exact(sock, wire.RESPONSE.size))
        return status, wire.recv_exact(sock, n)


def test_raw_sockets_and_borrowed_capabilities_are_refused(pool: Pool) -> None:
    with pool.client("alice-1", "tcp") as c:
        c.put("a", b"A" * 4096)
        c.put("b", b"B" * 4096)
    a, b = _looked_up(pool, "a").replicas[0], _looked_up(pool, "b").replicas[0]
    assert Capability.decode(a.capability).offset == a.offset
    assert Capability.decode(a.capability).length == a.length
    # A credentialed peer (even over TLS) with no capability: neither READ nor WRITE.
    status, _ = _raw(pool, TransferOp.READ, a.segment, 0, 8 * MIB)
    assert status == wire.Status.PERMISSION_DENIED
    status, _ = _raw(pool, TransferOp.WRITE, b.segment, b.offset, 4096, b"", b"X" * 4096)
    assert status == wire.Status.PERMISSION_DENIED
    # a's capability reads a, not b; and it does not write a.
    status, body = _raw(pool, TransferOp.READ, a.segment, a.offset, a.length, a.capability)
    assert status == wire.Status.OK and body == b"A" * 4096
    status, _ = _raw(pool, TransferOp.READ, b.segment, b.offset, b.length, a.capability)
    assert status == wire.Status.PERMISSION_DENIED
    status, _ = _raw(pool, TransferOp.WRITE, a.segment, a.offset, 4096, a.capability, b"X" * 4096)
    assert status == wire.Status.PERMISSION_DENIED
    # Same host, shared memory: no fd without a capability for that segment.
    shm_socket = pool.node.segments[0].shm_socket
    with pytest.raises(Exception, match="no capability"):
        fetch_fd(shm_socket, a.segment)
    # After its lease (300 ms of the master's clock) a's capability is refused.
    expiry = Capability.decode(a.capability).expiry_ms
    ring = pool.node.keyring
    assert ring is not None
    deadline = time.monotonic() + 10
    while ring.master_now_ms() <= expiry and time.monotonic() < deadline:
        time.sleep(0.02)  # waiting for a clock, not for another thread
    status, body = _raw(pool, TransferOp.READ, a.segment, a.offset, a.length, a.capability)
    assert status == wire.Status.PERMISSION_DENIED and b"expired" in body
    with pool.client("bob-1", "tcp") as c:  # the pool still serves (another tenant's keys)
        c.put("b2", b"2" * 100)
        assert c.get("b2") == b"2" * 100
    with pool.client("alice-1", "tcp") as c:
        assert c.get("b") == b"B" * 4096  # nothing was written by the refused requests


def test_a_new_registration_voids_the_old_key(pool: Pool, tmp_path: Path) -> None:
    with pool.client("alice-1", "tcp") as c:
        c.put("k", b"K" * 512)
    old = _looked_up(pool, "k").replicas[0]
    membership = pool.node.membership
    assert membership is not None
    membership.join()  # re-register: the master rotates the node's key
    status, _ = _raw(pool, TransferOp.READ, old.segment, old.offset, old.length, old.capability)
    assert status == wire.Status.PERMISSION_DENIED
    new = _looked_up(pool, "k").replicas[0]
    status, body = _raw(pool, TransferOp.READ, new.segment, new.offset, new.length, new.capability)
    assert status == wire.Status.OK and body == b"K" * 512


def test_extent_puts_carry_the_extents_capability(pool: Pool) -> None:
    """Small puts placed in the client's extent (GrantExtent's WRITE capability, renewed
    by each CommitExtent) reach a secured node and read back."""
    ring = pool.node.keyring
    assert ring is not None
    refused = ring.refused
    values = {f"e{i}": bytes([i]) * (1000 + i) for i in range(20)}
    with pool.client("alice-1", "tcp", extent_bytes=1 << 20) as c:
        for key, value in values.items():
            c.put(key, value)  # one CommitExtent each: the capability is renewed each time
        extents = c._ctx.extents
        assert extents.grants >= 1 and extents.fallbacks == 0
        for key, value in values.items():
            assert c.get(key) == value
    assert ring.refused == refused
