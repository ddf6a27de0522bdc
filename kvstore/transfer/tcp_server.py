"""TransferServer: serves one-sided READ/WRITE over TCP against exposed segments.

Blocking sockets, one thread per connection. Connections are capped in all
(`max_connections`) and per peer address (`max_connections_per_peer`); a connection
idle longer than `idle_timeout_s` is closed, and when a cap is reached the peer's (or
anyone's) longest-idle connection is closed to admit the new one, so idle sockets can
never lock clients out (only busy ones count against the caps; a request header must
arrive whole within `io_timeout`). Each request is bounds-checked
against the named segment; a bad one gets an error reply and the connection
stays usable (a bad WRITE's payload is drained, or the connection closed when
the payload is larger than `drain_limit`). Payloads go straight between the
socket and segment memory: `recv_into` a segment slice, `sendall` of a slice.

Secured mode (`keyring` given, kvstore.security.capabilities): every READ and WRITE
must carry a capability the master issued to this node for a range covering the
request's, in its mode, unexpired; else PERMISSION_DENIED and nothing is read or
written (a refused WRITE's payload is drained into scratch memory like any other bad
WRITE; the connection stays usable). Until the node has its key, everything is
refused. `tls` (an ssl.SSLContext, server side) wraps every accepted connection; the
handshake runs in the connection's thread within `io_timeout`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kvstore.buffers import byte_view
from kvstore.errors import BadRequestError, KVStoreError, NotFoundError
from kvstore.security.capabilities import Keyring
from kvstore.tiers.shm import SharedSegment
from kvstore.transfer import wire
from kvstore.transfer.base import (
    MAX_NAME_BYTES,
    SegmentDescriptor,
    TransferOp,
    check_name,
    local_host_id,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Listening address and per-connection limits of a TransferServer."""

    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port
    io_timeout: float = 30.0  # a started request must progress within this many seconds
    max_connections: int = 1024
    drain_limit: int = 64 << 20  # largest bad-WRITE payload drained instead of closing
    max_connections_per_peer: int = 256  # per peer IP address (same-host peers share one)
    idle_timeout_s: float = 300.0  # a connection idle this long is closed

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise BadRequestError(f"bad port {self.port}")
        if self.io_timeout <= 0 or self.max_connections <= 0 or self.drain_limit < 0:
            raise BadRequestError("io_timeout and max_connections must be > 0")
        if self.max_connections_per_peer <= 0 or self.idle_timeout_s <= 0:
            raise BadRequestError("max_connections_per_peer and idle_timeout_s must be > 0")


class RangeStore(Protocol):
    """A segment served through staging rather than as memory (kvstore.tiers.ssd_segment).

    `read_range` returns a view of exactly `length` bytes and its release callback;
    `write_range` hands `fill` a view of `length` bytes to fill from the socket,
    then stores it. Errors raised by `write_range` after `fill` ran carry
    `payload_consumed = True`."""

    @property
    def nbytes(self) -> int: ...
    def read_range(self, offset: int, length: int) -> tuple[memoryview, Callable[[], None]]: ...
    def write_range(self, offset: int, length: int, fill: Callable[[memoryview], None]) -> None: ...


class _CloseConnection(Exception):
    """The stream is out of sync or the peer misbehaved: drop this connection."""


@dataclass(slots=True)
class _Conn:
    """One served connection: its thread, its peer address, and since when it is idle
    (None while a request is being served)."""

    thread: threading.Thread
    peer: str
    idle_since: float | None


class TransferServer:
    """Serves READ/WRITE requests against the segments exposed by this process."""

    def __init__(
        self, config: ServerConfig | None = None, *, tls: ssl.SSLContext | None = None,
        keyring: Keyring | None = None, revoked: Callable[[bytes], bool] | None = None,
    ) -> None:  # fmt: skip
        self.config = config or ServerConfig()
        self.tls = tls
        self.revoked = revoked  # TLS: revoked(peer certificate DER) -> drop the connection
        self.keyring = keyring  # secured mode: capabilities checked (see the module doc)
        self._segments: dict[str, memoryview] = {}
        self._shm: dict[str, str | None] = {}  # name -> fd socket of shm segments
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._conns: dict[socket.socket, _Conn] = {}
        self.refused = 0  # connections closed at accept: the caps held, nothing idle to close
        self.idle_closed = 0  # idle connections closed (timeout, or to admit another)
        self._stopping = threading.Event()
        self._endpoint = ""

    # -- segments -------------------------------------------------------------

    def expose(
        self, name: str, buffer: object, *, shm: bool = False, shm_socket: str = ""
    ) -> SegmentDescriptor:
        """Serve `buffer` as segment `name`; `shm` marks it mappable by same-host
        peers, through the fd server at `shm_socket` (kvstore.tiers.shm)."""
        view = byte_view(buffer, writable=True)
        with self._lock:
            if check_name(name) in self._segments:
                raise BadRequestError(f"segment {name!r} already exposed")
            self._segments[name] = view
            self._shm[name] = shm_socket if shm else None
        return self.descriptor(name)

    def expose_segment(self, segment: SharedSegment) -> SegmentDescriptor:
        """Serve a SharedSegment over TCP and its fd to same-host peers."""
        return self.expose(segment.name, segment.buffer, shm=True, shm_socket=segment.serve())

    def withdraw(self, name: str) -> bool:
        """Stop serving a segment (requests in flight on it may still finish)."""
        with self._lock:
            self._shm.pop(name, None)
            return self._segments.pop(name, None) is not None

    def descriptor(self, name: str) -> SegmentDescriptor:
        with self._lock:
            view = self._segments.get(name)
            sock = self._shm.get(name)
        if view is None:
            raise NotFoundError(f"segment {name!r} not exposed")
        host, endpoint = local_host_id(), self._endpoint
        return SegmentDescriptor(
            name, view.nbytes, host, endpoint, sock is not None, b"", sock or ""
        )

    # -- lifecycle ------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """ "host:port" once started, else ""."""
        return self._endpoint

    def start(self) -> str:
        """Listen and accept in a background thread; returns the endpoint."""
        if self._listener is not None:
            raise BadRequestError("server already started")
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.config.host, self.config.port))
        listener.listen(128)
        self._listener = listener
        host, port = listener.getsockname()[:2]
        self._endpoint = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="kvstore-transfer-accept", daemon=True
        )
        self._accept_thread.start()
        return self._endpoint

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every connection; join threads within `timeout`."""
        self._stopping.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        with self._lock:
            conns = dict(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        threads = [*(c.thread for c in conns.values()), self._accept_thread]
        for thread in threads:
            if thread is not None:
                thread.join(timeout)

    def __enter__(self) -> TransferServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def connection_count(self) -> int:
        with self._lock:
            return len(self._conns)

    # -- serving --------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                conn, addr = self._listener.accept()
            except OSError:
                return  # listener closed by stop()
            peer = str(addr[0]) if isinstance(addr, tuple) else str(addr)
            if not self._make_room(peer):
                self.refused += 1
                conn.close()
                continue
            self._start_connection(conn, peer)

    def _make_room(self, peer: str) -> bool:
        """Whether a new connection from `peer` fits the caps, closing the longest-idle
        connection (the peer's own first) where one is in the way."""
        cfg = self.config
        with self._lock:
            mine = [(c, s) for c, s in self._conns.items() if s.peer == peer]
            if len(mine) >= cfg.max_connections_per_peer:
                victim = _longest_idle(mine)
            elif len(self._conns) >= cfg.max_connections:
                victim = _longest_idle(list(self._conns.items()))
            else:
                return True
            if victim is None:
                return False
            self._conns[victim].idle_since = None  # closing: not a victim twice
        self._close_idle(victim)
        return True

    def _close_idle(self, conn: socket.socket) -> None:
        self.idle_closed += 1
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)  # its thread sees EOF and drops it

    def _start_connection(self, conn: socket.socket, peer: str = "") -> None:
        wire.tune(conn, min(self.config.io_timeout, self.config.idle_timeout_s))
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError):
                conn.close()
                return
        thread = threading.Thread(
            target=self._serve_connection, args=(conn,), name="kvstore-transfer-conn", daemon=True
        )
        with self._lock:
            self._conns[conn] = _Conn(thread, peer, time.monotonic())
        thread.start()

    def _serve_connection(self, conn: socket.socket) -> None:
        try:
            if isinstance(conn, ssl.SSLSocket):
                conn.do_handshake()  # a peer that stalls or fails it is dropped
                if self.revoked is not None and self.revoked(conn.getpeercert(True) or b""):
                    log.info("transfer connection of a revoked certificate closed")
                    return
            while not self._stopping.is_set():
                header = self._recv_header(conn)
                if header is None:
                    return
                self._serve_request(conn, header)
        except (_CloseConnection, OSError) as e:
            log.debug("transfer connection closed: %s", e)
        except Exception:  # a bug must not kill the server: drop this connection only
            log.exception("transfer connection failed")
        finally:
            with self._lock:
                self._conns.pop(conn, None)
            conn.close()

    def _recv_header(self, conn: socket.socket) -> bytes | None:
        """The next request header; None on a clean close or after `idle_timeout_s` idle.
        A header that has started must be complete within `io_timeout`."""
        buf = memoryview(bytearray(wire.REQUEST.size))
        got = 0
        self._set_idle(conn, True)
        started = idle = time.monotonic()
        while got < len(buf):
            try:
                n = conn.recv_into(buf[got:])
            except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
                now = time.monotonic()
                if got == 0 and not self._stopping.is_set():
                    if now - idle < self.config.idle_timeout_s:
                        continue  # idle pooled connection
                    self.idle_closed += 1
                    return None
                raise
            if n == 0:
                if got:
                    raise _CloseConnection("peer closed inside a header")
                return None
            if got == 0:
                self._set_idle(conn, False)
                started = time.monotonic()
            elif time.monotonic() - started > self.config.io_timeout:
                raise _CloseConnection("request header trickled in too slowly")
            got += n
        return bytes(buf)

    def _set_idle(self, conn: socket.socket, idle: bool) -> None:
        with self._lock:
            state = self._conns.get(conn)
            if state is not None:
                state.idle_since = time.monotonic() if idle else None

    def _serve_request(self, conn: socket.socket, header: bytes) -> None:
        op, version, name_len, req_id, offset, length = wire.REQUEST.unpack(header)
        if name_len > MAX_NAME_BYTES:
            conn.sendall(wire.pack_error(req_id, BadRequestError("segment name too long")))
            raise _CloseConnection("bad header")
        if version != wire.VERSION:  # its name (as every version frames it), no further
            wire.recv_exact(conn, name_len)
            why = f"bad version {version}: this node speaks transfer protocol {wire.VERSION}"
            conn.sendall(wire.pack_error(req_id, BadRequestError(why)))
            raise _CloseConnection("bad version")
        tail = wire.recv_exact(conn, name_len + 1)  # the name and the capability's length
        name = tail[:name_len].decode(errors="replace")
        capability = wire.recv_exact(conn, tail[name_len]) if tail[name_len] else b""
        if op not in (TransferOp.READ, TransferOp.WRITE):
            conn.sendall(wire.pack_error(req_id, BadRequestError(f"unknown op {op}")))
            raise _CloseConnection("unknown op")
        try:
            if self.keyring is not None:
                self.keyring.check(name, offset, length, op, capability)
            target = self._target(name, offset, length)
        except KVStoreError as e:
            self._reject(conn, op, req_id, length, e)
            return
        if not isinstance(target, memoryview):
            self._serve_store(conn, op, req_id, target, offset, length)
            return
        if op == TransferOp.READ:
            wire.send_with_header(conn, wire.pack_response(wire.Status.OK, req_id, length), target)
        else:
            wire.recv_into_exact(conn, target)
            conn.sendall(wire.pack_response(wire.Status.OK, req_id, 0))

    def _serve_store(
        self, conn: socket.socket, op: int, req_id: int, store: RangeStore, offset: int,
        length: int,
    ) -> None:  # fmt: skip
        """A segment that is not plain memory (an SSD slab, device memory): the store
        stages the range; an error before the payload moves is a normal reject."""
        if op == TransferOp.READ:
            try:
                view, release = store.read_range(offset, length)
            except KVStoreError as e:
                conn.sendall(wire.pack_error(req_id, e))
                return
            try:
                header = wire.pack_response(wire.Status.OK, req_id, length)
                wire.send_with_header(conn, header, view)
            finally:
                release()
            return
        try:
            store.write_range(offset, length, lambda dst: wire.recv_into_exact(conn, dst))
        except KVStoreError as e:
            if not getattr(e, "payload_consumed", False):
                self._reject(conn, op, req_id, length, e)
                return
            conn.sendall(wire.pack_error(req_id, e))
            return
        conn.sendall(wire.pack_response(wire.Status.OK, req_id, 0))

    def expose_store(self, name: str, store: RangeStore) -> SegmentDescriptor:
        """Serve a `RangeStore` (e.g. an SSD segment) as segment `name`, TCP only."""
        with self._lock:
            if check_name(name) in self._segments:
                raise BadRequestError(f"segment {name!r} already exposed")
            self._segments[name] = store  # type: ignore[assignment]
            self._shm[name] = None
        return self.descriptor(name)

    def _target(self, name: str, offset: int, length: int) -> memoryview | RangeStore:
        with self._lock:
            view = self._segments.get(name)
        if view is None:
            raise NotFoundError(f"segment {name!r} not exposed")
        if offset + length > view.nbytes:
            raise BadRequestError(
                f"range [{offset}, +{length}) outside segment {name!r} of {view.nbytes} bytes"
            )
        if not isinstance(view, memoryview):
            return view  # a RangeStore checks the rest itself
        return view[offset : offset + length]

    def _reject(
        self, conn: socket.socket, op: int, req_id: int, length: int, error: KVStoreError
    ) -> None:
        """Reply with `error`; keep the stream in sync by draining a bad WRITE's payload."""
        if op == TransferOp.WRITE:
            if length > self.config.drain_limit:
                conn.sendall(wire.pack_error(req_id, error))
                raise _CloseConnection("bad WRITE too large to drain")
            _drain(conn, length)
        conn.sendall(wire.pack_error(req_id, error))


def _longest_idle(conns: list[tuple[socket.socket, _Conn]]) -> socket.socket | None:
    idle = [(s.idle_since, c) for c, s in conns if s.idle_since is not None]
    return min(idle, key=lambda pair: pair[0])[1] if idle else None


def _drain(conn: socket.socket, length: int) -> None:
    scratch = memoryview(bytearray(min(length, 1 << 20) or 1))
    left = length
    while left:
        n = conn.recv_into(scratch, min(left, len(scratch)))
        if n == 0:
            raise _CloseConnection("peer closed while draining a rejected WRITE")
        left -= n
