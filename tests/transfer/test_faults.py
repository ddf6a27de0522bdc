"""Faults: a peer killed or hung mid-transfer, garbage on the wire, clean stop."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from kvstore.errors import TransferError
from kvstore.transfer import wire
from kvstore.transfer.tcp import TcpConfig, TcpEngine
from kvstore.transfer.tcp_server import ServerConfig, TransferServer

from .conftest import ServerProcess

MiB = 1 << 20


def test_peer_killed_mid_transfer_gives_transfer_error_quickly(
    serve: Callable[..., ServerProcess],
) -> None:
    server = serve(64 * MiB)
    local = np.zeros(64 * MiB, dtype=np.uint8)
    first_done = threading.Event()
    outcome: list[BaseException] = []
    with TcpEngine(TcpConfig(connections=2, chunk_bytes=MiB, io_timeout=5)) as engine:
        buf = engine.register("b", local)

        def reader() -> None:
            try:
                for _ in range(10_000):  # bounded: fails long before this when killed
                    engine.read(server.desc, 0, 64 * MiB, buf, timeout=30)
                    first_done.set()
            except BaseException as e:
                outcome.append(e)

        thread = threading.Thread(target=reader)
        thread.start()
        assert first_done.wait(30)
        server.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        thread.join(20)
        assert not thread.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], TransferError), outcome
        assert time.monotonic() - killed_at < 6
        with pytest.raises(TransferError, match=r"cannot connect|failed"):
            engine.read(server.desc, 0, MiB, buf, timeout=10)  # dead peer: fails fast


def test_hung_peer_times_out_with_transfer_error(serve: Callable[..., ServerProcess]) -> None:
    server = serve(4 * MiB)
    local = bytearray(4 * MiB)
    with TcpEngine(TcpConfig(connections=1, io_timeout=0.5)) as engine:
        buf = engine.register("b", local)
        engine.read(server.desc, 0, MiB, buf, timeout=10)  # connection is up
        os.kill(server.proc.pid, signal.SIGSTOP)
        _, status = os.waitpid(server.proc.pid, os.WUNTRACED)  # every thread stopped
        assert os.WIFSTOPPED(status)
        try:
            started = time.monotonic()
            with pytest.raises(TransferError):
                engine.read(server.desc, 0, 4 * MiB, buf, timeout=10)
            assert time.monotonic() - started < 5  # io_timeout 0.5 s + a loaded machine
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)


def _raw_request(endpoint: str, payload: bytes) -> bytes:
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(payload)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_garbage_on_the_wire_closes_only_that_connection() -> None:
    segment = bytearray(range(256)) * 4
    with TransferServer(ServerConfig(io_timeout=0.3)) as server:
        desc = server.expose("seg", segment)
        bad_version = wire.REQUEST.pack(1, 99, 3, 5, 0, 4) + b"seg"
        reply = _raw_request(server.endpoint, bad_version)
        status, req_id, length = wire.RESPONSE.unpack_from(reply)
        assert (status, req_id) == (wire.Status.BAD_REQUEST, 5)
        assert len(reply) == wire.RESPONSE.size + length  # then closed by the server
        unknown_op = wire.pack_request(7, 6, b"seg", 0, 4)
        assert wire.RESPONSE.unpack_from(_raw_request(server.endpoint, unknown_op))[0] == 1
        truncated = wire.pack_request(1, 1, b"seg", 0, 4)[:10]
        assert _raw_request(server.endpoint, truncated) == b""
        local = bytearray(16)
        with TcpEngine(TcpConfig(connections=1)) as engine:
            engine.read(desc, 100, 16, engine.register("b", local), timeout=10)
        assert local == bytes(range(100, 116))


def test_stop_closes_idle_connections_and_joins_threads() -> None:
    server = TransferServer()
    server.start()
    desc = server.expose("seg", bytearray(1024))
    engine = TcpEngine(TcpConfig(connections=3))
    buf = engine.register("b", bytearray(1024))
    engine.submit([_read(desc, buf) for _ in range(6)]).wait(10)
    assert server.connection_count() >= 1
    started = time.monotonic()
    server.stop(timeout=5)
    assert time.monotonic() - started < 5
    assert server.connection_count() == 0
    with pytest.raises(TransferError):
        engine.read(desc, 0, 1024, buf, timeout=10)
    engine.close()


def _read(desc, buf):  # type: ignore[no-untyped-def]
    from kvstore.transfer.base import TransferOp, TransferRequest

    return TransferRequest(TransferOp.READ, desc, 0, 1024, buf)
