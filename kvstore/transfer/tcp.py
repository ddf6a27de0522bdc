"""TcpEngine: the initiator side of the TCP transport.

Per peer endpoint a pool of `connections` blocking sockets, each owned by one
worker thread. A batch is cut into chunks of at most `chunk_bytes`; workers pull
chunks from the peer's queue, so a batch (and one large transfer) is spread over
all connections in parallel. A batch small enough for one window (one peer, at most
`depth` requests and `chunk_bytes` in all: a single get or put) runs in the calling
thread on the peer's own inline socket when that is free: no hand-off to a worker
and back, two thread wake-ups that cost ~100-300 us here on a 1 MiB get.

Payloads go straight between the socket and the registered buffer (`recv_into` /
`sendall` of memoryview slices). Every socket operation has `io_timeout`; a dead or
hung peer yields TransferError. Each request's capability (TransferRequest.capability,
from the master) travels with every chunk of it. `tls` (an ssl.SSLContext, client
side) wraps every connection; the node's certificate is checked against its CA and
the endpoint's host (or `server_name`).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import ssl
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.errors import BadRequestError, KVStoreError, TransferError
from kvstore.transfer import wire
from kvstore.transfer.base import (
    TransferEngine,
    TransferHandle,
    TransferOp,
    TransferRequest,
    parse_endpoint,
)


@dataclass(frozen=True, slots=True)
class TcpConfig:
    """Pool size, chunking and timeouts of a TcpEngine."""

    connections: int = 4  # sockets (and worker threads) per peer
    chunk_bytes: int = 4 << 20  # largest piece of one request sent as one wire request
    depth: int = 8  # requests pipelined per connection (while under chunk_bytes in total)
    connect_timeout: float = 5.0
    io_timeout: float = 30.0  # a blocked send/recv longer than this fails the chunk
    tls: ssl.SSLContext | None = None  # TLS to every node (kvstore.security.credentials)
    server_name: str = ""  # TLS: the name to expect in nodes' certificates ("" = host)

    def __post_init__(self) -> None:
        if not 1 <= self.connections <= 64:
            raise BadRequestError(f"connections must be in [1, 64], got {self.connections}")
        if self.chunk_bytes < 4096:
            raise BadRequestError(f"chunk_bytes must be >= 4096, got {self.chunk_bytes}")
        if not 1 <= self.depth <= 64:
            raise BadRequestError(f"depth must be in [1, 64], got {self.depth}")
        if self.connect_timeout <= 0 or self.io_timeout <= 0:
            raise BadRequestError("timeouts must be > 0")


class _RequestState:
    """Counts a request's outstanding chunks; completes the handle at the last one."""

    def __init__(self, handle: TransferHandle, index: int, chunks: int) -> None:
        self._handle, self._index, self._left = handle, index, chunks
        self._error: Exception | None = None
        self._lock = threading.Lock()

    def chunk_done(self, error: Exception | None) -> None:
        with self._lock:
            self._error = self._error or error
            self._left -= 1
            last = self._left == 0
        if last:
            self._handle.complete(self._index, self._error)


@dataclass(frozen=True, slots=True)
class _Chunk:
    op: TransferOp
    name: bytes
    remote_offset: int
    view: memoryview
    state: _RequestState
    capability: bytes = b""


class _Connection:
    """One socket to a peer, used by one worker thread at a time."""

    def __init__(self, endpoint: str, config: TcpConfig) -> None:
        self._addr = parse_endpoint(endpoint)
        self._config = config
        self._sock: socket.socket | None = None
        self._next_id = 0
        self._reply = memoryview(bytearray(wire.RESPONSE.size))

    def run(self, chunks: list[_Chunk]) -> list[Exception | None]:
        """Execute a window of chunks pipelined (all requests sent, then all replies
        read in order): a typed error per chunk; a stream fault fails the rest of the
        window with TransferError and drops the socket."""
        results: list[Exception | None] = []
        reused = self._sock is not None
        try:
            sock = self._connect()
            ids = [self._send(sock, chunk) for chunk in chunks]
            for chunk, req_id in zip(chunks, ids, strict=True):
                results.append(self._finish(sock, req_id, chunk))
        except KVStoreError as e:
            results += [e] * (len(chunks) - len(results))
        except (OSError, ConnectionError) as e:
            self.close()
            if reused and not results:  # a pooled socket the server closed while it idled:
                return self.run(chunks)  # once more on a fresh one (READ/WRITE repeat safely)
            error = TransferError(f"transfer to {self._addr[0]}:{self._addr[1]} failed: {e}")
            results += [error] * (len(chunks) - len(results))
        return results

    def _send(self, sock: socket.socket, chunk: _Chunk) -> int:
        self._next_id = req_id = (self._next_id + 1) & 0xFFFFFFFF
        n = chunk.view.nbytes
        header = wire.pack_request(
            chunk.op, req_id, chunk.name, chunk.remote_offset, n, chunk.capability
        )
        if chunk.op == TransferOp.READ:
            sock.sendall(header)
            return req_id
        try:
            wire.send_with_header(sock, header, chunk.view)
        except OSError:
            self._finish_early(sock)  # the peer may have rejected the WRITE and closed
            raise
        return req_id

    def _finish_early(self, sock: socket.socket) -> None:
        """After a failed send, surface the peer's error reply if one arrived."""
        with contextlib.suppress(OSError, ConnectionError):
            wire.tune(sock, 0.5)
            status, _, length = wire.RESPONSE.unpack(wire.recv_exact(sock, wire.RESPONSE.size))
            if status != wire.Status.OK:
                message = wire.recv_exact(sock, min(length, wire.MAX_ERROR_BYTES))
                self.close()
                raise wire.error_of(status, message.decode(errors="replace"))

    def _finish(self, sock: socket.socket, req_id: int, chunk: _Chunk) -> Exception | None:
        """Read one reply: None, or the peer's typed error (stream stays in sync)."""
        wire.recv_into_exact(sock, self._reply)
        status, got_id, length = wire.RESPONSE.unpack(self._reply)
        if got_id != req_id:
            raise ConnectionError(f"response for request {got_id}, expected {req_id}")
        if status != wire.Status.OK:
            if length > wire.MAX_ERROR_BYTES:
                raise ConnectionError(f"error message of {length} bytes")
            return wire.error_of(status, wire.recv_exact(sock, length).decode(errors="replace"))
        want = chunk.view.nbytes if chunk.op == TransferOp.READ else 0
        if length != want:
            raise ConnectionError(f"response of {length} bytes, expected {want}")
        if chunk.op == TransferOp.READ:
            wire.recv_into_exact(sock, chunk.view)
        return None

    def _connect(self) -> socket.socket:
        if self._sock is None:
            try:
                sock = socket.create_connection(self._addr, timeout=self._config.connect_timeout)
            except OSError as e:
                raise TransferError(f"cannot connect to {self._addr}: {e}") from e
            tls = self._config.tls
            if tls is not None:
                try:
                    name = self._config.server_name or self._addr[0]
                    sock = tls.wrap_socket(sock, server_hostname=name)
                except OSError as e:  # a certificate that does not verify, a refused handshake
                    sock.close()
                    raise TransferError(f"TLS to {self._addr} failed: {e}") from e
            wire.tune(sock, self._config.io_timeout)
            self._sock = sock
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


class _Peer:
    """The connection pool and worker threads for one endpoint, and the inline socket
    a caller borrows (under `inline_lock`) for a batch of one window."""

    def __init__(self, endpoint: str, config: TcpConfig) -> None:
        self.queue: queue.SimpleQueue[_Chunk | None] = queue.SimpleQueue()
        self._config = config
        self.inline = _Connection(endpoint, config)
        self.inline_lock = threading.Lock()
        self._conns = [_Connection(endpoint, config) for _ in range(config.connections)]
        self._threads = [
            threading.Thread(target=self._work, args=(c,), name="kvstore-tcp-worker", daemon=True)
            for c in self._conns
        ]
        for thread in self._threads:
            thread.start()

    def _work(self, conn: _Connection) -> None:
        while window := self._window():
            try:
                results = conn.run(window)
            except Exception as e:  # a bug: never lose a completion
                results = [TransferError(f"transfer failed: {e!r}")] * len(window)
            for chunk, error in zip(window, results, strict=True):
                chunk.state.chunk_done(error)
        conn.close()

    def _window(self) -> list[_Chunk]:
        """Block for one chunk, then take queued ones up to `depth` and `chunk_bytes`
        in total; [] when closing."""
        first = self.queue.get()
        if first is None:
            return []
        window, size = [first], first.view.nbytes
        while len(window) < self._config.depth and size < self._config.chunk_bytes:
            try:
                chunk = self.queue.get_nowait()
            except queue.Empty:
                break
            if chunk is None:
                self.queue.put(None)  # keep the stop signal for this worker's next call
                break
            window.append(chunk)
            size += chunk.view.nbytes
        return window

    def close(self, timeout: float) -> None:
        for _ in self._threads:
            self.queue.put(None)
        for thread in self._threads:
            thread.join(timeout)
        if self.inline_lock.acquire(timeout=timeout):  # not while a caller is on it
            try:
                self.inline.close()
            finally:
                self.inline_lock.release()


class TcpEngine(TransferEngine):
    """One-sided READ/WRITE against TransferServers over pooled TCP connections."""

    kind = "tcp"

    def __init__(self, config: TcpConfig | None = None) -> None:
        super().__init__()
        self.config = config or TcpConfig()
        self._peers: dict[str, _Peer] = {}
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, batch: Sequence[TransferRequest]) -> TransferHandle:
        views = self.check_batch(batch)
        for req in batch:
            if not req.remote.endpoint:
                raise BadRequestError(f"segment {req.remote.name!r} has no TCP endpoint")
        handle = TransferHandle(len(batch))
        if self._run_inline(handle, batch, views):
            return handle
        for index, (req, view) in enumerate(zip(batch, views, strict=True)):
            self._enqueue(handle, index, req, view)
        return handle

    def _run_inline(
        self, handle: TransferHandle, batch: Sequence[TransferRequest], views: list[memoryview]
    ) -> bool:
        """Run `batch` in this thread as one pipelined window on its peer's inline socket,
        if it fits one window and that socket is free; whether it did (then `handle` is
        complete)."""
        endpoint = batch[0].remote.endpoint if batch else ""
        total = sum(req.length for req in batch)
        if (
            not batch
            or len(batch) > self.config.depth
            or total > self.config.chunk_bytes
            or any(req.remote.endpoint != endpoint or not req.length for req in batch)
        ):
            return False
        peer = self._peer(endpoint)
        if not peer.inline_lock.acquire(blocking=False):
            return False  # another caller is on it: the workers take this batch
        try:
            chunks = [
                _Chunk(req.op, req.remote.name.encode(), req.remote_offset, view,
                       _RequestState(handle, i, 1), req.capability)
                for i, (req, view) in enumerate(zip(batch, views, strict=True))
            ]  # fmt: skip
            try:
                results = peer.inline.run(chunks)
            except Exception as e:  # a bug: never lose a completion
                results = [TransferError(f"transfer failed: {e!r}")] * len(chunks)
        finally:
            peer.inline_lock.release()
        for chunk, error in zip(chunks, results, strict=True):
            chunk.state.chunk_done(error)
        return True

    def _enqueue(
        self, handle: TransferHandle, index: int, req: TransferRequest, view: memoryview
    ) -> None:
        if req.length == 0:
            handle.complete(index, None)
            return
        step = self.config.chunk_bytes
        starts = range(0, req.length, step)
        state = _RequestState(handle, index, len(starts))
        peer = self._peer(req.remote.endpoint)
        name = req.remote.name.encode()
        for start in starts:
            piece = view[start : start + step]
            peer.queue.put(
                _Chunk(req.op, name, req.remote_offset + start, piece, state, req.capability)
            )

    def _peer(self, endpoint: str) -> _Peer:
        with self._lock:
            if self._closed:
                raise TransferError("engine is closed")
            peer = self._peers.get(endpoint)
            if peer is None:
                peer = self._peers[endpoint] = _Peer(endpoint, self.config)
            return peer

    def close(self, timeout: float = 5.0) -> None:
        """Finish queued chunks, then close every connection (joins within `timeout`)."""
        with self._lock:
            self._closed = True
            peers, self._peers = list(self._peers.values()), {}
        for peer in peers:
            peer.close(timeout)
