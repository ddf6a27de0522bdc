"""The TCP data plane's connection caps and idle timeouts (issue 10, point 4): idle
sockets, however many, never lock clients out; a peer cannot hold more than its share;
a header that trickles in, and a connection left idle, are closed."""

from __future__ import annotations

import socket
import time

import pytest

from kvstore.errors import TransferError
from kvstore.transfer import wire
from kvstore.transfer.tcp import TcpConfig, TcpEngine
from kvstore.transfer.tcp_server import ServerConfig, TransferServer

KIB = 1 << 10


def connect(endpoint: str) -> socket.socket:
    host, port = endpoint.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def closed_by_peer(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def wait_until(pred, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)  # another thread's progress
    return False


def read_back(server: TransferServer, data: bytes, timeout: float = 10.0) -> bytes:
    with TcpEngine(TcpConfig(connections=2, io_timeout=5)) as engine:
        out = bytearray(len(data))
        buf = engine.register("out", out)
        engine.read(server.descriptor("seg"), 0, len(data), buf, timeout=timeout)
        return bytes(out)


@pytest.fixture
def data() -> bytes:
    return bytes(range(256)) * 16


def test_256_idle_connections_do_not_lock_clients_out(data: bytes) -> None:
    with TransferServer() as server:  # the default caps
        server.expose("seg", bytearray(data))
        idle = [connect(server.endpoint) for _ in range(300)]  # more than the old cap of 256
        try:
            assert wait_until(lambda: server.connection_count() >= 256)
            started = time.monotonic()
            assert read_back(server, data) == data
            assert time.monotonic() - started < 5
            assert server.connection_count() <= server.config.max_connections_per_peer
        finally:
            for s in idle:
                s.close()


def test_caps_close_the_longest_idle_first(data: bytes) -> None:
    cfg = ServerConfig(max_connections=6, max_connections_per_peer=3, io_timeout=0.5)
    with TransferServer(cfg) as server:
        server.expose("seg", bytearray(data))
        first, *rest = [connect(server.endpoint) for _ in range(3)]
        assert wait_until(lambda: server.connection_count() == 3)
        newest = connect(server.endpoint)  # over the peer's cap: the longest idle goes
        assert closed_by_peer(first, 5)
        assert not closed_by_peer(newest, 0.2)
        assert server.idle_closed >= 1
        assert read_back(server, data) == data
        for s in [*rest, newest]:
            s.close()


def test_busy_connections_are_never_closed_for_room(data: bytes) -> None:
    cfg = ServerConfig(max_connections=4, max_connections_per_peer=2, io_timeout=1.0)
    with TransferServer(cfg) as server:
        server.expose("seg", bytearray(data))
        busy = [connect(server.endpoint) for _ in range(2)]
        for s in busy:
            s.sendall(b"\x01\x01")  # a header begun: the connection is serving
        assert wait_until(lambda: server.connection_count() == 2)
        time.sleep(0.1)  # let both threads see their first bytes
        refused = connect(server.endpoint)
        assert closed_by_peer(refused, 5) and server.refused >= 1
        with pytest.raises(TransferError):
            read_back(server, data, timeout=3)
        for s in busy:  # a header must arrive whole within io_timeout: they are dropped
            assert closed_by_peer(s, 5)
        assert read_back(server, data) == data


def test_a_trickling_header_is_dropped() -> None:
    cfg = ServerConfig(io_timeout=0.4)
    with TransferServer(cfg) as server:
        server.expose("seg", bytearray(4 * KIB))
        s = connect(server.endpoint)
        header = wire.pack_request(1, 1, b"seg", 0, 16)
        dropped = False
        for byte in header:  # one byte every 0.3 s: each recv is in time, the header is not
            try:
                s.sendall(bytes([byte]))
            except OSError:
                dropped = True
                break
            if closed_by_peer(s, 0.3):
                dropped = True
                break
        assert dropped
        s.close()


def test_idle_connections_time_out_and_pooled_clients_reconnect(data: bytes) -> None:
    cfg = ServerConfig(idle_timeout_s=0.3, io_timeout=0.2)
    with TransferServer(cfg) as server:
        server.expose("seg", bytearray(data))
        lone = connect(server.endpoint)
        assert closed_by_peer(lone, 5)
        with TcpEngine(TcpConfig(connections=1, io_timeout=5)) as engine:
            out = bytearray(len(data))
            buf = engine.register("out", out)
            engine.read(server.descriptor("seg"), 0, len(data), buf, timeout=10)
            assert wait_until(lambda: server.connection_count() == 0)  # its socket timed out
            out[:] = bytes(len(data))
            engine.read(server.descriptor("seg"), 0, len(data), buf, timeout=10)  # reconnects
            assert bytes(out) == data
