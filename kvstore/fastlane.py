"""The master's fast lane: its hot-path calls over one framed TCP connection.

A Python gRPC unary call costs ~480 us here even against a bare grpc.aio server
(bench/profile_ops.py measures it), while a request/reply over a plain socket to
an asyncio Protocol costs ~55 us. A put was two such gRPC calls and a get one, so at
<= 1 MiB the round trips, not the bytes, set the pace (issue 14). The fast lane
carries the *same* protobuf messages to the *same* servicer methods for the calls on
the hot path (`METHODS`); everything else, and every call when the lane is down,
goes over gRPC. It is plaintext: a master whose gRPC port is secured does not open
one (kvstore.master.server), so it never becomes a way around the credentials.

On Linux the lane also listens on an abstract Unix socket (`unix:@kvstore-lane-...`,
Stats' `fast_lane_local`; no file, the kernel drops the name with the master). A
client in the master's host and network namespace connects there first: a one-key
BatchLookup took 159 us over loopback TCP and 114 us over the Unix socket here
(bench/rpc_floor.py, 2026-12-03). A client that cannot reach the name (another host
or network namespace) uses the TCP address.

Frames, little-endian:

    request   u32 length-of-rest | u32 id | u8 method | protobuf request
    reply     u32 length-of-rest | u32 id | u8 status | protobuf reply, or UTF-8 message

`status` is the gRPC status code number (0 = OK), so one mapping
(kvstore.rpc_errors) turns it into the same typed error a gRPC call raises. Replies
carry their request's id: the async client multiplexes calls on one connection;
the sync client keeps one connection per thread.

    lane = await FastLaneServer.start(servicer, "127.0.0.1")     # lane.address
    client = SyncLane(lane.address, timeout_s=5.0)
    reply = client.call("BatchLookup", request)                  # or raises KVStoreError
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import secrets
import socket
import struct
import sys
import threading
import time
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import grpc

from kvstore.busypoll import Spinner, recv_polling
from kvstore.errors import BadRequestError, KVStoreError, NotLeaderError, UnavailableError
from kvstore.rpc_errors import error_for_status, status_for
from kvstore.v1 import master_pb2

# The hot path: what a put and a get call. Ids are the index (append only: wire format).
METHODS = (
    "PutStart", "PutEnd", "PutRevoke", "BatchLookup", "Stats", "GrantExtent", "CommitExtent",
    "NodeTasks",  # the nodes' long poll for tier moves: a PutEnd of an SSD replica waits on it
)  # fmt: skip
_ID = {name: i for i, name in enumerate(METHODS)}
_REQUEST = [getattr(master_pb2, f"{m}Request") for m in METHODS]
_REPLY = [getattr(master_pb2, f"{m}Response") for m in METHODS]
HEADER = struct.Struct("<IIB")  # length of the rest, id, method (request) / status (reply)
MAX_FRAME = 64 << 20  # as gRPC's max message size
_STATUS = {code.value[0]: code for code in grpc.StatusCode}


def _frame(ident: int, tag: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload) + 5, ident, tag) + payload


def _error(status: int, payload: bytes) -> KVStoreError:
    code = _STATUS.get(status, grpc.StatusCode.UNKNOWN)
    return error_for_status(code, payload.decode("utf-8", "replace"))


# ---- server ------------------------------------------------------------------


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Context:
    """The part of grpc.aio.ServicerContext the servicer uses (abort, peer, metadata)."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Abort(code, details)

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def code(self) -> None:
        return None


class _ServerConnection(asyncio.Protocol):
    def __init__(self, lane: FastLaneServer) -> None:
        self.lane = lane
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.ctx = _Context("")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        _nodelay(transport.get_extra_info("socket"))
        peer = transport.get_extra_info("peername") or ("?", 0)
        self.ctx = _Context(f"ipv4:{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "unix:")
        self.lane.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lane.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        if not self.buf and len(data) >= HEADER.size:  # nearly always: one whole request
            n, ident, method = HEADER.unpack_from(data)
            if len(data) == 4 + n and n >= 5:  # (a bad length takes the checks below)
                self._start(self._answer(ident, method, data[HEADER.size :]))
                return
        self.buf += data
        while len(self.buf) >= 4:
            (n,) = struct.unpack_from("<I", self.buf)
            if n < 5 or n > MAX_FRAME:
                self._fail(f"bad frame length {n}")
                return
            if len(self.buf) < 4 + n:
                return
            _, ident, method = HEADER.unpack_from(self.buf)
            payload = bytes(self.buf[HEADER.size : 4 + n])
            del self.buf[: 4 + n]
            self._start(self._answer(ident, method, payload))

    def _start(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run one request right here, up to its first real wait. A call that does not
        wait (nearly all: the servicer's methods are async but rarely await) is answered
        within this callback, a loop iteration sooner than as a Task (Python 3.12's
        eager tasks, by hand); one that waits (a PutEnd of an SSD replica, the nodes'
        long poll) goes on in a Task, in its own context, as if it had been one."""
        ctx = contextvars.copy_context()  # per request, as a Task would have its own
        try:
            awaited = ctx.run(coro.send, None)
        except StopIteration:
            return
        task = asyncio.get_running_loop().create_task(_resume(coro, awaited), context=ctx)
        self.lane.tasks.add(task)
        task.add_done_callback(self.lane.tasks.discard)
        task.add_done_callback(lambda _: ctx.run(_cancel_unfinished, coro))

    def _fail(self, why: str) -> None:
        """A peer that breaks the framing gets its connection closed (nothing else)."""
        self.lane.protocol_errors += 1
        if self.transport is not None:
            self.transport.close()

    async def _answer(self, ident: int, method: int, payload: bytes) -> None:
        started = time.perf_counter()
        status, body, name = await self.lane.dispatch(method, payload, self.ctx)
        self.lane.observe(name, time.perf_counter() - started, status)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_frame(ident, status, body))


@types.coroutine
def _resume(coro: Coroutine[Any, Any, None], awaited: Any) -> Generator[Any, None, None]:
    """The body of a Task that takes over `coro`, suspended on `awaited` (the future it
    yielded, or None for a bare yield): the Task waits on that as it would have for
    `coro`, then steps `coro` on, throwing into it what the Task got meanwhile (its
    cancellation)."""
    while True:
        exc: BaseException | None = None
        try:
            yield awaited
        except BaseException as e:  # handed to `coro`, where it waits
            exc = e
        try:
            awaited = coro.send(None) if exc is None else coro.throw(exc)
        except StopIteration:
            return


def _cancel_unfinished(coro: Coroutine[Any, Any, None]) -> None:
    """A Task cancelled before its first step never reached `coro` (a cancellation
    thrown into a generator that has not started stops it there): cancel `coro` where
    it waits, and close it if it waits again."""
    if inspect.getcoroutinestate(coro) != inspect.CORO_SUSPENDED:
        return
    with contextlib.suppress(BaseException):
        coro.throw(asyncio.CancelledError())
    coro.close()


class FastLaneServer:
    """Serves `METHODS` of one servicer on a TCP port (the master's host, port 0) and,
    on Linux, an abstract Unix socket (`local`, "" where there is none)."""

    def __init__(
        self, servicer: Any, servers: list[asyncio.Server], local: str,
        observe: Callable[..., None],
    ) -> None:  # fmt: skip
        self.servicer = servicer
        self.servers = servers
        self.connections: set[_ServerConnection] = set()
        self.tasks: set[asyncio.Future[None]] = set()
        self.protocol_errors = 0
        self._observe = observe
        host, port = servers[0].sockets[0].getsockname()[:2]
        self.address = f"{host}:{port}"
        self.local = local

    @classmethod
    async def start(
        cls, servicer: Any, host: str, observe: Callable[[str, float, int], None] | None = None,
        local: bool = True,
    ) -> FastLaneServer:  # fmt: skip
        """Listen on `host`, a free port, and (`local`, Linux) an abstract Unix socket;
        `observe(method, seconds, status)` per call."""
        loop = asyncio.get_running_loop()
        holder: list[FastLaneServer] = []

        def factory() -> _ServerConnection:
            return _ServerConnection(holder[0])

        servers = [await loop.create_server(factory, host, 0)]
        name = ""
        if local and sys.platform == "linux":
            name = f"kvstore-lane-{secrets.token_hex(8)}"  # random: unguessable, never reused
            try:
                servers.append(await loop.create_unix_server(factory, "\0" + name))
            except OSError:  # no Unix sockets here (a sandbox): TCP only
                name = ""
        lane = cls(servicer, servers, f"{UNIX}{name}" if name else "", observe or (lambda *_: None))
        holder.append(lane)
        return lane

    def observe(self, method: str, seconds: float, status: int) -> None:
        self._observe(method, seconds, status)

    async def dispatch(self, method: int, payload: bytes, ctx: _Context) -> tuple[int, bytes, str]:
        """(status, reply or message, method name) of one request."""
        if not 0 <= method < len(METHODS):
            code = grpc.StatusCode.UNIMPLEMENTED
            return code.value[0], f"no fast-lane method {method}".encode(), "?"
        name = METHODS[method]
        try:
            request = _REQUEST[method].FromString(payload)
            behavior = getattr(self.servicer, name)
            guard = getattr(self.servicer, "guard", None)  # kvstore.security: gRPC's limits
            if not hasattr(guard, "call"):  # none (or a stand-in that forwards every name)
                reply = await behavior(request, ctx)
            else:
                reply = await guard.call(name, behavior, request, ctx)
            return 0, reply.SerializeToString(), name
        except _Abort as exc:
            return exc.code.value[0], str(exc).encode(), name
        except KVStoreError as exc:
            return status_for(exc).value[0], str(exc).encode(), name
        except Exception as exc:  # a malformed message, or a bug: INTERNAL, never a hang
            code = grpc.StatusCode.INVALID_ARGUMENT if _is_decode(exc) else grpc.StatusCode.INTERNAL
            return code.value[0], f"{type(exc).__name__}: {exc}".encode(), name

    async def stop(self) -> None:
        for server in self.servers:
            server.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:  # let each see its cancellation (bounded: a servicer may ignore it)
            await asyncio.wait(tasks, timeout=2.0)
        for server in self.servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2.0)


def _is_decode(exc: Exception) -> bool:
    return type(exc).__name__ == "DecodeError"


# ---- clients -----------------------------------------------------------------


def _check_method(method: str) -> int:
    ident = _ID.get(method)
    if ident is None:
        raise BadRequestError(f"{method} is not a fast-lane method")
    return ident


def serves(method: str) -> bool:
    """Whether `method` may go over the fast lane."""
    return method in _ID


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


UNIX = "unix:@"  # an abstract Unix socket's address: unix:@NAME (no file behind it)


def _nodelay(sock: socket.socket | None) -> None:
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _candidates(address: str, local: str) -> list[str]:
    """The addresses to try, in order: the Unix socket where one is known, then TCP."""
    return [a for a in (local, address) if a]


def _connect(address: str, timeout_s: float) -> socket.socket:
    """A blocking socket connected to `address` (HOST:PORT or unix:@NAME)."""
    if address.startswith(UNIX):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect("\0" + address[len(UNIX) :])
        except OSError:
            sock.close()
            raise
        return sock
    sock = socket.create_connection(_split(address), timeout_s)
    _nodelay(sock)
    return sock


class LaneDown(UnavailableError):
    """The lane is unreachable or its connection broke (e.g. the master restarted):
    the call goes over gRPC instead. Every fast-lane method is safe to send again
    after a broken connection: a master that restarted lost the first attempt's
    uncommitted state, and PutEnd/PutRevoke/BatchLookup/Stats repeat harmlessly."""


class SyncLane:
    """Blocking client: one connection per calling thread, opened on first use, to
    `local` (unix:@NAME) where that connects, else to `address` (HOST:PORT)."""

    def __init__(
        self, address: str, timeout_s: float, local: str = "", busy_poll_s: float = 0.0
    ) -> None:
        self.address = address
        self.local = local
        self.timeout_s = timeout_s
        self.busy_poll_s = busy_poll_s  # poll for a reply this long first (kvstore.busypoll)
        self._local = threading.local()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._ids = 0

    def _sock(self) -> socket.socket:
        sock = getattr(self._local, "sock", None)
        if sock is None:
            sock = self._open()
            _deadline(sock, self.timeout_s)
            self._local.sock = sock
            self._local.spinner = Spinner(self.busy_poll_s)
            with self._lock:
                self._socks.append(sock)
        return sock

    def call(self, method: str, request: Any) -> Any:
        """The reply of one call; the call's KVStoreError; LaneDown if nothing was sent."""
        tag = _check_method(method)
        sock = self._sock()
        self._ids = ident = (self._ids + 1) & 0xFFFFFFFF
        try:
            sock.sendall(_frame(ident, tag, request.SerializeToString()))
            # nearly always the whole reply in one recv: polled for a while, then waited for
            data = recv_polling(sock, RECV_BYTES, self._local.spinner)
            if data is None:
                data = sock.recv(RECV_BYTES)
            if len(data) < HEADER.size:
                if not data:
                    raise ConnectionError("connection closed")
                data += _recv_exact(sock, HEADER.size - len(data))
            n, got, status = HEADER.unpack_from(data)
            if n < 5 or n > MAX_FRAME:
                self._drop(sock)
                raise UnavailableError(f"fast lane {self.address}: bad reply length {n}")
            if len(data) == n + 4:
                body = data[HEADER.size :]
            elif len(data) < n + 4:
                body = data[HEADER.size :] + _recv_exact(sock, n + 4 - len(data))
            else:  # more than one reply: never sent to a client with one call in flight
                self._drop(sock)
                raise UnavailableError(f"fast lane {self.address}: bytes past the reply")
        except (TimeoutError, BlockingIOError):  # the master is slow: as a gRPC deadline
            # (no retry elsewhere; BlockingIOError: the kernel's timeout, see _deadline)
            self._drop(sock)
            raise UnavailableError(
                f"fast lane {self.address}: no reply in {self.timeout_s} s"
            ) from None
        except OSError as exc:  # reset or closed (e.g. the master restarted): use gRPC
            self._drop(sock)
            raise LaneDown(f"fast lane {self.address}: {exc}") from None
        if got != ident:
            self._drop(sock)
            raise UnavailableError(f"fast lane {self.address}: reply to {got}, want {ident}")
        if status:
            raise _error(status, body)
        return _REPLY[tag].FromString(body)

    def _open(self) -> socket.socket:
        failure: OSError | None = None
        for address in _candidates(self.address, self.local):
            try:
                return _connect(address, min(2.0, self.timeout_s))
            except OSError as exc:
                failure = exc
                if address == self.local:
                    self.local = ""  # not this client's host or namespace: TCP from now on
        raise LaneDown(f"fast lane {self.address} unreachable: {failure}") from None

    def _drop(self, sock: socket.socket) -> None:
        self._local.sock = None
        with self._lock:
            if sock in self._socks:
                self._socks.remove(sock)
        with contextlib.suppress(OSError):
            sock.close()

    def close(self) -> None:
        """Close every thread's connection; a call blocked on one ends (LaneDown)."""
        with self._lock:
            socks, self._socks = self._socks, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked in another thread
            with contextlib.suppress(OSError):
                sock.close()


def _deadline(sock: socket.socket, timeout_s: float) -> None:
    """Bound each send and recv on `sock` by `timeout_s`. On Linux by the kernel
    (SO_RCVTIMEO / SO_SNDTIMEO on a blocking socket: it then raises BlockingIOError),
    since Python's own timeout polls before every send and recv: two syscalls more per
    call; elsewhere by Python's."""
    if sys.platform != "linux" or not 0 < timeout_s < 1 << 31:
        sock.settimeout(timeout_s)
        return
    sock.settimeout(None)
    seconds = int(timeout_s)
    micros = int((timeout_s - seconds) * 1e6) or (0 if seconds else 1)  # 0 s 0 us: forever
    tv = struct.pack("@ll", seconds, micros)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


RECV_BYTES = 16 << 10  # a sync call's first read: the header and any reply this small


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("connection closed")
        got += k
    return bytes(buf)


class _AsyncConnection(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiting: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        _nodelay(transport.get_extra_info("socket"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= HEADER.size:
            n, ident, status = HEADER.unpack_from(self.buf)
            if len(self.buf) < 4 + n:
                return
            body = bytes(self.buf[HEADER.size : 4 + n])
            del self.buf[: 4 + n]
            fut = self.waiting.pop(ident, None)
            if fut is not None and not fut.done():
                fut.set_result((status, body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(UnavailableError(f"fast lane connection lost: {exc}"))
        self.waiting.clear()


class AsyncLane:
    """asyncio client: one connection, calls multiplexed by id (to `local` where that
    connects, else `address`, as SyncLane)."""

    def __init__(self, address: str, timeout_s: float, local: str = "") -> None:
        self.address = address
        self.local = local
        self.timeout_s = timeout_s
        self._conn: _AsyncConnection | None = None
        self._connecting: asyncio.Lock | None = None
        self._ids = 0

    async def _connection(self) -> _AsyncConnection:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._conn is None or self._conn.closed:
                self._conn = await self._open()
        return self._conn

    async def _open(self) -> _AsyncConnection:
        loop = asyncio.get_running_loop()
        failure: BaseException | None = None
        for address in _candidates(self.address, self.local):
            if address.startswith(UNIX):
                opening = loop.create_unix_connection(_AsyncConnection, "\0" + address[len(UNIX) :])
            else:
                opening = loop.create_connection(_AsyncConnection, *_split(address))
            try:
                _, conn = await asyncio.wait_for(opening, min(2.0, self.timeout_s))
                return conn
            except (TimeoutError, OSError) as exc:
                failure = exc
                if address == self.local:
                    self.local = ""
        raise LaneDown(f"fast lane {self.address} unreachable: {failure}") from None

    async def call(self, method: str, request: Any) -> Any:
        tag = _check_method(method)
        conn = await self._connection()
        self._ids = ident = (self._ids + 1) & 0xFFFFFFFF
        fut: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        conn.waiting[ident] = fut
        assert conn.transport is not None
        conn.transport.write(_frame(ident, tag, request.SerializeToString()))
        try:
            status, body = await asyncio.wait_for(fut, self.timeout_s)
        except TimeoutError:
            conn.waiting.pop(ident, None)
            raise UnavailableError(
                f"fast lane {self.address}: no reply in {self.timeout_s} s"
            ) from None
        except UnavailableError as exc:  # the connection broke: use gRPC
            raise LaneDown(str(exc)) from None
        if status:
            raise _error(status, body)
        return _REPLY[tag].FromString(body)

    def close(self) -> None:
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.close()
        self._conn = None


# ---- routing a client's calls ------------------------------------------------

RETRY_AFTER_S = 5.0  # after the lane failed, calls go over gRPC this long before a new probe


class _Router:
    """Which calls go over the lane: learnt from the master's Stats (`fast_lane`)."""

    def __init__(self, timeout_s: float, on_stats: Callable[[Any], None] | None) -> None:
        self.timeout_s = timeout_s
        self.on_stats = on_stats or (lambda _reply: None)
        self.address = ""
        self.probe_at = 0.0  # monotonic time of the next probe; inf = never (disabled)
        self.fallbacks = 0  # calls that went to gRPC because the lane broke

    def disable(self) -> None:
        self.probe_at = float("inf")

    def _due(self, method: str) -> bool:
        return serves(method) and time.monotonic() >= self.probe_at

    @staticmethod
    def _learnt(reply: Any) -> tuple[str, str]:
        """(TCP address, Unix address) of the lane, from a Stats reply."""
        return str(getattr(reply, "fast_lane", "")), str(getattr(reply, "fast_lane_local", ""))

    def _failed(self) -> None:
        self.fallbacks += 1
        self.probe_at = time.monotonic() + RETRY_AFTER_S


class SyncRouter(_Router):
    """Routes a sync client's calls: `call(method, request, grpc_call)`; the lane's
    replies are polled for `busy_poll_s` before a call sleeps (kvstore.busypoll)."""

    def __init__(
        self, timeout_s: float, on_stats: Callable[[Any], None] | None = None,
        busy_poll_s: float = 0.0,
    ) -> None:  # fmt: skip
        super().__init__(timeout_s, on_stats)
        self.busy_poll_s = busy_poll_s
        self.lane: SyncLane | None = None

    def call(self, method: str, request: Any, grpc_call: Callable[[str, Any], Any]) -> Any:
        if self.lane is None and self._due(method):
            self._probe(grpc_call)
        lane = self.lane
        if lane is None or not serves(method):
            return grpc_call(method, request)
        try:
            return lane.call(method, request)
        except (LaneDown, NotLeaderError):  # gRPC follows the leader; then a new probe
            self._drop()
            return grpc_call(method, request)

    def _probe(self, grpc_call: Callable[[str, Any], Any]) -> None:
        self.probe_at = time.monotonic() + RETRY_AFTER_S  # one probe at a time
        reply = grpc_call("Stats", master_pb2.StatsRequest())
        self.on_stats(reply)  # the client's segment directory: its first resolve is free
        address, local = self._learnt(reply)
        if address:
            self.lane = SyncLane(address, self.timeout_s, local, self.busy_poll_s)

    def _drop(self) -> None:
        if self.lane is not None:
            self.lane.close()
        self.lane = None
        self._failed()

    def close(self) -> None:
        self.disable()
        if self.lane is not None:
            self.lane.close()
            self.lane = None


class AsyncRouter(_Router):
    """Routes an async client's calls: `await call(method, request, grpc_call)`."""

    def __init__(self, timeout_s: float, on_stats: Callable[[Any], None] | None = None) -> None:
        super().__init__(timeout_s, on_stats)
        self.lane: AsyncLane | None = None

    async def call(self, method: str, request: Any, grpc_call: Callable[[str, Any], Any]) -> Any:
        if self.lane is None and self._due(method):
            self.probe_at = time.monotonic() + RETRY_AFTER_S
            reply = await grpc_call("Stats", master_pb2.StatsRequest())
            self.on_stats(reply)
            address, local = self._learnt(reply)
            if address:
                self.lane = AsyncLane(address, self.timeout_s, local)
        lane = self.lane
        if lane is None or not serves(method):
            return await grpc_call(method, request)
        try:
            return await lane.call(method, request)
        except (LaneDown, NotLeaderError):
            lane.close()
            self.lane = None
            self._failed()
            return await grpc_call(method, request)

    def close(self) -> None:
        self.disable()
        if self.lane is not None:
            self.lane.close()
            self.lane = None
