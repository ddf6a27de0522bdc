"""Data-plane capabilities and TLS on the TCP data plane (issue 10, point 2): a secured
node serves a one-sided READ or WRITE only with a capability the master issued to it
for a covering range, in that mode, unexpired; everything else is refused with
PERMISSION_DENIED and nothing is read or written. Real sockets, real TLS handshakes."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.errors import PermissionDeniedError, TransferError
from kvstore.security import capabilities
from kvstore.security.capabilities import READ, WRITE, Capability, Issuer, Keyring
from kvstore.security.config import SecurityConfig
from kvstore.security.credentials import data_plane_client, data_plane_server
from kvstore.tiers.shm import FdServer, SharedSegment, fetch_fd
from kvstore.transfer import wire
from kvstore.transfer.base import TransferOp, TransferRequest
from kvstore.transfer.shm import ShmEngine, fd_gate
from kvstore.transfer.tcp import TcpConfig, TcpEngine
from kvstore.transfer.tcp_server import TransferServer
from tests.security.helpers import Pki

KIB = 1 << 10


class Clock:
    """A monotonic clock the test moves (the master's and the node's are separate)."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clocks() -> tuple[Clock, Clock]:
    return Clock(1000.0), Clock(-55555.0)  # two hosts' monotonic clocks share no origin


@pytest.fixture
def pair(clocks: tuple[Clock, Clock]) -> tuple[Issuer, Keyring]:
    """A master's issuer and node n1's keyring, the key handed over as RegisterNode does."""
    master, node = clocks
    issuer, ring = Issuer(master), Keyring("n1", node)
    sent = node.now
    master.now += 0.003  # the request's way to the master
    key = issuer.rotate("n1")
    node.now += 0.006  # the whole round trip, seen from the node
    ring.install(key.secret, key.key_id, key.clock_ms, sent)
    return issuer, ring


def test_a_capability_grants_its_range_and_mode_only(pair: tuple[Issuer, Keyring]) -> None:
    issuer, ring = pair
    cap = issuer.grant("n1", "seg", 4096, 8192, READ, ttl_s=5)
    assert len(cap) == capabilities.SIZE == 45
    ring.check("seg", 4096, 8192, READ, cap)  # the range itself
    ring.check("seg", 8192, 4096, READ, cap)  # a chunk inside it (the TCP engine cuts chunks)
    for segment, offset, length, mode in [
        ("seg", 0, 4096, READ),  # range B, before A
        ("seg", 4096, 8193, READ),  # one byte past A
        ("seg", 12288, 1, READ),  # right after A
        ("seg", 4096, 8192, WRITE),  # a WRITE with a READ capability
        ("other", 4096, 8192, READ),  # another segment of the same node
    ]:
        with pytest.raises(PermissionDeniedError):
            ring.check(segment, offset, length, mode, cap)
    with pytest.raises(PermissionDeniedError, match="no capability"):
        ring.check("seg", 4096, 8192, READ, b"")
    assert ring.refused == 6


def test_a_tampered_capability_is_refused(pair: tuple[Issuer, Keyring]) -> None:
    issuer, ring = pair
    cap = issuer.grant("n1", "seg", 0, 4096, READ, ttl_s=5)
    for i in range(len(cap)):  # every byte: a field rewritten, or the MAC itself
        bad = bytearray(cap)
        bad[i] ^= 0x01
        with pytest.raises(PermissionDeniedError):
            ring.check("seg", 0, 4096, READ, bytes(bad))
    widened = Capability.decode(cap)  # re-encode a wider range under the old tag
    forged = capabilities._BODY.pack(READ, widened.key_id, widened.expiry_ms, 0, 1 << 30)
    with pytest.raises(PermissionDeniedError, match="does not verify"):
        ring.check("seg", 0, 1 << 20, READ, forged + widened.tag)
    with pytest.raises(PermissionDeniedError):
        ring.check("seg", 0, 4096, READ, cap[:-1])  # truncated


def test_a_capability_for_node_x_is_refused_by_node_y(clocks: tuple[Clock, Clock]) -> None:
    master, node = clocks
    issuer = Issuer(master)
    kx, ky = issuer.rotate("x"), issuer.rotate("y")
    ring_y = Keyring("y", node)
    ring_y.install(ky.secret, ky.key_id, ky.clock_ms, node.now)
    cap_x = issuer.grant("x", "seg", 0, 4096, WRITE, ttl_s=5)
    with pytest.raises(PermissionDeniedError, match="does not verify"):
        ring_y.check("seg", 0, 4096, WRITE, cap_x)
    # Even a node holding x's very secret refuses it: the node id is under the MAC.
    impostor = Keyring("y", node)
    impostor.install(kx.secret, kx.key_id, kx.clock_ms, node.now)
    with pytest.raises(PermissionDeniedError, match="does not verify"):
        impostor.check("seg", 0, 4096, WRITE, cap_x)
    ring_y.check("seg", 0, 4096, WRITE, issuer.grant("y", "seg", 0, 4096, WRITE, ttl_s=5))


def test_expiry_is_bounded_whatever_the_clock_skew(clocks: tuple[Clock, Clock]) -> None:
    """The node's clock has another origin (and the hosts' wall clocks are never read):
    a capability is honoured up to its lease and never after, by the master's clock."""
    master, node = clocks
    issuer, ring = Issuer(master), Keyring("n1", node)
    sent = node.now
    master.now += 0.002
    key = issuer.rotate("n1")
    master.now += 0.002
    node.now += 0.004
    ring.install(key.secret, key.key_id, key.clock_ms, sent)
    cap = issuer.grant("n1", "seg", 0, 4096, READ, ttl_s=1.0)
    master.now += 0.9
    node.now += 0.9
    ring.check("seg", 0, 4096, READ, cap)  # inside the lease
    master.now += 0.1
    node.now += 0.1  # the master's lease has just ended (it began 2 ms into the round trip)
    with pytest.raises(PermissionDeniedError, match="expired"):
        ring.check("seg", 0, 4096, READ, cap)
    assert ring.master_now_ms() >= issuer.now_ms()  # the node's estimate never lags
    # A heartbeat re-anchors: still never behind the master, however far the clocks are.
    master.now += 3600.0
    node.now += 3600.0
    sent = node.now
    master.now += 0.0005
    reading = issuer.now_ms()
    node.now += 0.001
    ring.anchor(reading, sent)
    assert issuer.now_ms() <= ring.master_now_ms() <= issuer.now_ms() + 2


def test_a_new_key_voids_every_earlier_capability(pair: tuple[Issuer, Keyring]) -> None:
    issuer, ring = pair
    old = issuer.grant("n1", "seg", 0, 4096, READ, ttl_s=60)
    key = issuer.rotate("n1")  # the node registered again
    ring.install(key.secret, key.key_id, key.clock_ms, ring._clock())
    with pytest.raises(PermissionDeniedError):
        ring.check("seg", 0, 4096, READ, old)
    ring.check("seg", 0, 4096, READ, issuer.grant("n1", "seg", 0, 4096, READ, ttl_s=60))
    ring.clear()
    with pytest.raises(PermissionDeniedError, match="no key"):
        ring.check("seg", 0, 4096, READ, issuer.grant("n1", "seg", 0, 4096, READ, ttl_s=60))


# ---- a secured TransferServer, over real sockets --------------------------------------


@pytest.fixture
def secured(pair: tuple[Issuer, Keyring]) -> Iterator[tuple[Issuer, TransferServer, bytearray]]:
    issuer, ring = pair
    memory = bytearray(bytes(range(256)) * 64)  # 16 KiB
    with TransferServer(keyring=ring) as server:
        server.expose("seg", memory)
        yield issuer, server, memory


def raw_request(sock: socket.socket, op: int, offset: int, length: int, cap: bytes = b"",
                payload: bytes = b"") -> tuple[int, bytes]:  # fmt: skip
    """One request on a raw socket; (status, body)."""
    sock.sendall(wire.pack_request(op, 7, b"seg", offset, length, cap) + payload)
    status, req_id, n = wire.RESPONSE.unpack(wire.recv_exact(sock, wire.RESPONSE.size))
    assert req_id == 7
    return status, wire.recv_exact(sock, n)


def test_a_raw_socket_cannot_read_or_write_a_secured_node(
    secured: tuple[Issuer, TransferServer, bytearray],
) -> None:
    issuer, server, memory = secured
    before = bytes(memory)
    host, port = server.endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        status, body = raw_request(sock, TransferOp.READ, 0, 4096)
        assert status == wire.Status.PERMISSION_DENIED and b"no capability" in body
        status, body = raw_request(sock, TransferOp.WRITE, 0, 4096, payload=b"\xee" * 4096)
        assert status == wire.Status.PERMISSION_DENIED
        forged = bytes(capabilities.SIZE)
        status, _ = raw_request(sock, TransferOp.WRITE, 0, 16, forged, b"\xee" * 16)
        assert status == wire.Status.PERMISSION_DENIED
        assert bytes(memory) == before  # nothing written on refusal
        # The connection stayed in sync: a granted request on it is served.
        cap = issuer.grant("n1", "seg", 1024, 16, READ, ttl_s=5)
        status, body = raw_request(sock, TransferOp.READ, 1024, 16, cap)
        assert status == wire.Status.OK and body == before[1024:1040]


def test_the_engine_sends_capabilities_and_gets_typed_refusals(
    secured: tuple[Issuer, TransferServer, bytearray],
) -> None:
    issuer, server, memory = secured
    desc = server.descriptor("seg")
    out = bytearray(8 * KIB)
    with TcpEngine(TcpConfig(connections=1, chunk_bytes=4096, io_timeout=5)) as engine:
        buf = engine.register("out", out)

        def run(op: TransferOp, offset: int, length: int, cap: bytes) -> Exception | None:
            req = TransferRequest(op, desc, offset, length, buf, 0, cap)
            return engine.submit([req]).wait(10)[0]

        a = issuer.grant("n1", "seg", 0, 8 * KIB, READ, ttl_s=5)
        assert run(TransferOp.READ, 0, 8 * KIB, a) is None  # two chunks, one capability
        assert bytes(out) == bytes(memory[: 8 * KIB])
        assert isinstance(run(TransferOp.READ, 8 * KIB, 4 * KIB, a), PermissionDeniedError)
        assert isinstance(run(TransferOp.WRITE, 0, 4 * KIB, a), PermissionDeniedError)
        assert isinstance(run(TransferOp.READ, 0, 4 * KIB, b""), PermissionDeniedError)
        before = bytes(memory)
        out[:] = b"\x5a" * len(out)
        w = issuer.grant("n1", "seg", 4 * KIB, 4 * KIB, WRITE, ttl_s=5)
        assert isinstance(run(TransferOp.WRITE, 0, 8 * KIB, w), PermissionDeniedError)
        # the chunk outside w was refused and did not land (the one inside w may: a chunk
        # is checked on its own, and w grants it)
        assert bytes(memory[: 4 * KIB]) == before[: 4 * KIB]
        assert run(TransferOp.WRITE, 4 * KIB, 4 * KIB, w) is None
        assert bytes(memory[4 * KIB : 8 * KIB]) == b"\x5a" * 4 * KIB


def test_a_capability_replayed_after_its_lease_is_refused(
    secured: tuple[Issuer, TransferServer, bytearray], clocks: tuple[Clock, Clock]
) -> None:
    issuer, server, _ = secured
    master, node = clocks
    cap = issuer.grant("n1", "seg", 0, 64, READ, ttl_s=2.0)
    host, port = server.endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        assert raw_request(sock, TransferOp.READ, 0, 64, cap)[0] == wire.Status.OK
        master.now += 2.0
        node.now += 2.0
        status, body = raw_request(sock, TransferOp.READ, 0, 64, cap)
        assert status == wire.Status.PERMISSION_DENIED and b"expired" in body


def test_an_old_protocol_version_gets_a_clear_error(
    secured: tuple[Issuer, TransferServer, bytearray],
) -> None:
    _, server, _ = secured
    host, port = server.endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(wire.REQUEST.pack(TransferOp.READ, 1, 3, 9, 0, 16) + b"seg")  # version 1
        status, _, n = wire.RESPONSE.unpack(wire.recv_exact(sock, wire.RESPONSE.size))
        assert status == wire.Status.BAD_REQUEST
        assert b"speaks transfer protocol 2" in wire.recv_exact(sock, n)
        assert sock.recv(1) == b""  # then closed


# ---- shared memory: the fd only for a capability, to an allowed uid -------------------


def test_a_secured_fd_server_hands_a_segment_only_for_a_capability(
    pair: tuple[Issuer, Keyring],
) -> None:
    issuer, ring = pair
    server = FdServer(authorize=fd_gate(ring))
    server.start()
    seg = SharedSegment.create("kvs-captest-dram-00000001", 64 * KIB)
    try:
        seg.buffer[:5] = b"hello"
        seg.serve(server)
        with pytest.raises(Exception, match="no capability"):
            fetch_fd(server.address, seg.name)
        other = issuer.grant("n1", "kvs-other-dram-00000002", 0, 4096, READ, ttl_s=5)
        with pytest.raises(Exception, match="does not verify"):
            fetch_fd(server.address, seg.name, capability=other)
        with pytest.raises(PermissionDeniedError, match="uid 4242"):
            server.authorize(seg.name, issuer.grant("n1", seg.name, 0, 8, READ, 5), 4242)  # type: ignore[misc]
        cap = issuer.grant("n1", seg.name, 0, 8, READ, ttl_s=5)
        with ShmEngine() as engine:
            from kvstore.transfer.base import SegmentDescriptor, local_host_id

            desc = SegmentDescriptor(seg.name, seg.size, local_host_id(), "", True, b"",
                                     server.address)  # fmt: skip
            out = bytearray(5)
            buf = engine.register("out", out)
            denied = engine.submit([TransferRequest(TransferOp.READ, desc, 0, 5, buf)]).wait(5)
            assert denied[0] is not None and "no capability" in str(denied[0])
            req = TransferRequest(TransferOp.READ, desc, 0, 5, buf, 0, cap)
            assert engine.submit([req]).wait(5) == [None]
            assert bytes(out) == b"hello"
        assert server.refused == 0  # refusals are answered (typed), not dropped
        assert ring.refused == 4  # no capability, another segment's, the uid, the engine's
    finally:
        seg.close()
        server.stop()


# ---- TLS on the TCP data plane -------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def tls_read(server: TransferServer, sec: SecurityConfig, n: int = 4096) -> bytes:
    cfg = TcpConfig(connections=1, io_timeout=5, connect_timeout=5, tls=data_plane_client(sec))
    with TcpEngine(cfg) as engine:
        out = bytearray(n)
        engine.read(server.descriptor("seg"), 0, n, engine.register("out", out), timeout=10)
        return bytes(out)


def test_tls_data_plane_and_a_wrong_ca_client_is_refused(pki: Pki, tmp_path: Path) -> None:
    data = bytes(range(256)) * 16
    with TransferServer(tls=data_plane_server(pki.tls("n1"))) as server:
        server.expose("seg", bytearray(data))
        assert tls_read(server, pki.tls("alice-1")) == data
        # A client whose certificate another CA signed: the node refuses it.
        with pytest.raises(TransferError):
            tls_read(server, pki.tls("alice-1", ca_dir=pki.other))
        # A client that trusts another CA: it refuses the node's certificate.
        theirs = SecurityConfig(
            ca_file=str(pki.other / "ca.crt"), cert_file=str(pki.other / "alice-1.crt"),
            key_file=str(pki.other / "alice-1.key"),
        )  # fmt: skip
        with pytest.raises(TransferError, match="certificate verify failed"):
            tls_read(server, theirs)
        # Plaintext framing to a TLS node: no answer but a closed connection.
        host, port = server.endpoint.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(wire.pack_request(TransferOp.READ, 1, b"seg", 0, 16))
            got = b""
            for _ in range(64):  # until the node closes (a TLS alert may come first)
                try:
                    chunk = sock.recv(4096)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                got += chunk
            assert data[:16] not in got and not got.startswith(wire.pack_response(0, 1, 16))
        assert tls_read(server, pki.tls("alice-1")) == data  # still serving


def test_stamping_a_batch_grants_each_location_its_own_range(
    pair: tuple[Issuer, Keyring],
) -> None:
    """The master's batch path (`Issuer.stamp`, as its replies use it) on real Locations."""
    from kvstore.v1 import common_pb2

    issuer, ring = pair
    locs = [common_pb2.Location(node_id="n1", segment="seg", offset=i * 4096, length=4096)
            for i in range(3)]  # fmt: skip
    locs.append(common_pb2.Location(node_id="ghost", segment="seg", offset=0, length=1))
    issuer.stamp(locs, WRITE, ttl_s=5)
    for i, loc in enumerate(locs[:3]):
        ring.check("seg", i * 4096, 4096, WRITE, loc.capability)
        with pytest.raises(PermissionDeniedError):
            ring.check("seg", (i + 1) % 3 * 4096, 4096, WRITE, loc.capability)
    assert locs[3].capability == b""  # a node the master gave no key


@pytest.mark.skipif(os.getuid() != 0, reason="becoming another uid needs root")
@pytest.mark.parametrize("allowed", [(), (65534,)])
def test_the_fd_gate_checks_the_peer_uid(
    pair: tuple[Issuer, Keyring], allowed: tuple[int, ...]
) -> None:
    """A real process of another uid (nobody), holding a valid capability: refused unless
    its uid is allowed (NodeConfig.shm_peer_uids)."""
    issuer, ring = pair
    server = FdServer(authorize=fd_gate(ring, allowed))
    server.start()
    seg = SharedSegment.create(f"kvs-uidtest-dram-{os.getpid():08x}", 64 * KIB)
    try:
        seg.serve(server)
        cap = issuer.grant("n1", seg.name, 0, 64, READ, ttl_s=30)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: become nobody, ask for the fd (modules are loaded)
            try:
                os.setgid(65534)
                os.setuid(65534)
                os.close(fetch_fd(server.address, seg.name, capability=cap))
                os.write(w, b"fd")
            except BaseException as e:  # reported to the parent
                os.write(w, str(e).encode()[:500])
            finally:
                os._exit(0)
        os.close(w)
        got = b""
        while chunk := os.read(r, 4096):
            got += chunk
        os.close(r)
        os.waitpid(pid, 0)
        if allowed:
            assert got == b"fd"
        else:
            assert b"uid 65534 is not allowed" in got
    finally:
        seg.close()
        server.stop()


def test_a_revoked_certificate_is_dropped_by_the_data_plane(pki: Pki) -> None:
    from kvstore.security.credentials import revoked_check

    data = bytes(range(256)) * 16
    revoked = revoked_check(str(pki.dir / "revoked.list"))
    with TransferServer(tls=data_plane_server(pki.tls("n1")), revoked=revoked) as server:
        server.expose("seg", bytearray(data))
        with pytest.raises(TransferError):
            tls_read(server, pki.tls("revoked"))  # signed by the CA, listed as revoked
        assert tls_read(server, pki.tls("alice-1")) == data
