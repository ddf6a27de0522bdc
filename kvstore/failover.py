"""Channels to a pool's masters that follow the leader (HA mode, kvstore.master.ha).

    channel = sync_channel(["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"])
    stub = master_pb2_grpc.MasterStub(channel)    # any stub, unchanged
    stub.Stats(request, timeout=5.0)              # goes to the leader, wherever it is

With one address these are the plain channels of `kvstore.edge` (single-master mode
is unchanged). With several, each unary call goes to the master believed to lead; an
UNAVAILABLE answer moves on: to the address a follower names ("not leader: leader is
HOST:PORT", kvstore.errors.NotLeaderError) or else to the next address, pausing after
each full round, until `failover_s` has passed; then the last gRPC error is raised, so
callers map it as before (kvstore.rpc_errors). Retried are only UNAVAILABLE answers:
a refused call did nothing (followers refuse before running it) and a dead leader's
connection fails before or while sending. A DEADLINE_EXCEEDED (a leader that stalls)
is raised, and the next call starts from the next address.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from kvstore.edge import GRPC_OPTIONS, aio_channel
from kvstore.edge import sync_channel as _plain_sync_channel
from kvstore.errors import BadRequestError, NotLeaderError
from kvstore.transfer.base import parse_endpoint

DEFAULT_FAILOVER_S = 15.0
PAUSE_S = (0.05, 0.5)  # pause after a full round of refusals: first, most
# Reconnect quickly to a master that comes back (gRPC's default backoff grows to 120 s).
_OPTIONS = [
    *GRPC_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def split_masters(masters: str | Sequence[str]) -> list[str]:
    """ "a:1,b:2" or ["a:1", "b:2"] -> ["a:1", "b:2"], each checked, duplicates dropped."""
    items = masters.split(",") if isinstance(masters, str) else list(masters)
    out: list[str] = []
    for item in (i.strip() for i in items):
        if item and item not in out:
            parse_endpoint(item)
            out.append(item)
    if not out:
        raise BadRequestError(f"no master address in {masters!r}")
    return out


class _Leader:
    """Which address to try first; moved by refusals, shared by every call."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self.addresses = list(addresses)
        self.current = self.addresses[0]
        self._lock = threading.Lock()

    def failed(self, address: str, err: grpc.RpcError) -> None:
        """`address` answered `err`: follow its leader hint, else the next address."""
        hint = _hint(err)
        with self._lock:
            if self.current != address:
                return  # another call moved on already
            if hint:
                if hint not in self.addresses:
                    self.addresses.append(hint)  # a leader we were not told of
                self.current = hint
            else:
                i = self.addresses.index(address)
                self.current = self.addresses[(i + 1) % len(self.addresses)]


def _hint(err: grpc.RpcError) -> str:
    details = err.details() if hasattr(err, "details") else ""
    parsed = NotLeaderError.parse(details or "")
    return parsed.leader if parsed is not None else ""


def _code(err: grpc.RpcError) -> grpc.StatusCode | None:
    return err.code() if hasattr(err, "code") else None


class _Attempts:
    """The retry schedule of one call: a deadline and a pause after each full round."""

    def __init__(self, n: int, failover_s: float, timeout: float | None) -> None:
        self.n = max(1, n)
        self.deadline = time.monotonic() + failover_s
        self.timeout = timeout
        self.tried = 0
        self.pause = PAUSE_S[0]

    def timeout_left(self) -> float | None:
        return self.timeout  # each try gets the caller's timeout; the deadline bounds tries

    def next_pause(self, err: grpc.RpcError) -> float | None:
        """Seconds to wait before the next try, or None: give up and raise `err`."""
        if _code(err) != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= self.deadline:
            return None
        self.tried += 1
        if self.tried % self.n:
            return 0.0
        pause, self.pause = self.pause, min(self.pause * 2, PAUSE_S[1])
        return min(pause, max(0.0, self.deadline - time.monotonic()))


# ---- blocking -------------------------------------------------------------------


class FailoverChannel:
    """A grpc.Channel look-alike over several masters (what stubs need of a channel)."""

    def __init__(
        self, addresses: Sequence[str], credentials: object | None = None,
        failover_s: float = DEFAULT_FAILOVER_S,
    ) -> None:  # fmt: skip
        self.leader = _Leader(addresses)
        self.failover_s = failover_s
        self._credentials = credentials
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def channel(self, address: str) -> grpc.Channel:
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                if self._credentials is not None:
                    ch = grpc.secure_channel(address, self._credentials, options=_OPTIONS)  # type: ignore[arg-type]
                else:
                    ch = grpc.insecure_channel(address, options=_OPTIONS)
                self._channels[address] = ch
            return ch

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> _UnaryUnary:
        return _UnaryUnary(self, lambda ch: ch.unary_unary(method, *args, **kwargs))

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()

    def __enter__(self) -> FailoverChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _UnaryUnary:
    def __init__(self, owner: FailoverChannel, make: Callable[[grpc.Channel], Any]) -> None:
        self._owner = owner
        self._make = make
        self._calls: dict[str, Any] = {}

    def _call_on(self, address: str) -> Any:
        call = self._calls.get(address)
        if call is None:
            call = self._calls[address] = self._make(self._owner.channel(address))
        return call

    def __call__(self, request: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        leader = self._owner.leader
        plan = _Attempts(len(leader.addresses), self._owner.failover_s, timeout)
        while True:
            address = leader.current
            try:
                return self._call_on(address)(request, timeout=plan.timeout_left(), **kwargs)
            except grpc.RpcError as err:
                leader.failed(address, err)
                pause = plan.next_pause(err)
                if pause is None:
                    raise
                time.sleep(pause)

    def future(self, request: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """One try on the current master (long polls); a refusal moves the next try."""
        address = self._owner.leader.current
        fut = self._call_on(address).future(request, timeout=timeout, **kwargs)
        leader = self._owner.leader

        def done(f: Any) -> None:
            if not f.cancelled() and isinstance(f.exception(), grpc.RpcError):
                leader.failed(address, f.exception())

        fut.add_done_callback(done)
        return fut


def sync_channel(
    masters: str | Sequence[str], credentials: object | None = None,
    failover_s: float = DEFAULT_FAILOVER_S,
) -> grpc.Channel:  # fmt: skip
    """A plain channel to one master, a FailoverChannel to several."""
    addresses = split_masters(masters)
    if len(addresses) == 1:
        return _plain_sync_channel(addresses[0], credentials)
    return FailoverChannel(addresses, credentials, failover_s)  # type: ignore[return-value]


# ---- asyncio --------------------------------------------------------------------


class AioFailoverChannel:
    """The grpc.aio twin of FailoverChannel (channels made on first use, in the loop)."""

    def __init__(
        self, addresses: Sequence[str], credentials: object | None = None,
        failover_s: float = DEFAULT_FAILOVER_S,
    ) -> None:  # fmt: skip
        self.leader = _Leader(addresses)
        self.failover_s = failover_s
        self._credentials = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            if self._credentials is not None:
                ch = grpc.aio.secure_channel(address, self._credentials, options=_OPTIONS)  # type: ignore[arg-type]
            else:
                ch = grpc.aio.insecure_channel(address, options=_OPTIONS)
            self._channels[address] = ch
        return ch

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> _AioUnaryUnary:
        return _AioUnaryUnary(self, lambda ch: ch.unary_unary(method, *args, **kwargs))

    async def close(self, grace: float | None = None) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            await ch.close(grace)


class _AioUnaryUnary:
    def __init__(self, owner: AioFailoverChannel, make: Callable[[Any], Any]) -> None:
        self._owner = owner
        self._make = make
        self._calls: dict[str, Any] = {}

    def __call__(self, request: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        return self._run(request, timeout, kwargs)

    async def _run(self, request: Any, timeout: float | None, kwargs: dict[str, Any]) -> Any:
        leader = self._owner.leader
        plan = _Attempts(len(leader.addresses), self._owner.failover_s, timeout)
        while True:
            address = leader.current
            call = self._calls.get(address)
            if call is None:
                call = self._calls[address] = self._make(self._owner.channel(address))
            try:
                return await call(request, timeout=plan.timeout_left(), **kwargs)
            except grpc.RpcError as err:
                leader.failed(address, err)
                pause = plan.next_pause(err)
                if pause is None:
                    raise
                await asyncio.sleep(pause)


def aio_failover_channel(
    masters: str | Sequence[str], credentials: object | None = None,
    failover_s: float = DEFAULT_FAILOVER_S,
) -> grpc.aio.Channel:  # fmt: skip
    """A plain aio channel to one master, an AioFailoverChannel to several."""
    addresses = split_masters(masters)
    if len(addresses) == 1:
        return aio_channel(addresses[0], credentials)
    return AioFailoverChannel(addresses, credentials, failover_s)  # type: ignore[return-value]
