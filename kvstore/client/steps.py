"""Client operations written once, run by a sync or an async driver.

An operation is a generator that yields steps and receives their results:
`Rpc(method, request)` (a master call) or `Io(fn)` (blocking work: transfers).
A failed step's KVStoreError is thrown back into the generator, so an operation
can clean up (e.g. revoke a put) where it failed. `run_sync` executes steps in
the caller's thread; `run_async` awaits grpc.aio calls and runs Io in an executor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from kvstore.errors import KVStoreError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Rpc:
    """Call master method `method` with `request`; the step's result is the reply."""

    method: str
    request: Any


@dataclass(frozen=True, slots=True)
class Io:
    """Run blocking `fn()`; the step's result is its return value."""

    fn: Callable[[], Any]


Step = Rpc | Io
Op = Generator[Step, Any, T]


def run_sync(op: Op[T], call: Callable[[Rpc], Any]) -> T:
    """Drive `op` in this thread; `call` performs one Rpc (raising KVStoreError)."""
    value: Any = None
    error: KVStoreError | None = None
    while True:
        try:
            step = op.send(value) if error is None else op.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value, error = None, None
        try:
            value = call(step) if isinstance(step, Rpc) else step.fn()
        except KVStoreError as exc:
            error = exc


async def run_async(
    op: Op[T],
    call: Callable[[Rpc], Awaitable[Any]],
    run_io: Callable[[Callable[[], Any]], Awaitable[Any]],
) -> T:
    """Drive `op` on the event loop: `call` awaits an Rpc, `run_io` runs an Io off-loop."""
    value: Any = None
    error: KVStoreError | None = None
    while True:
        try:
            step = op.send(value) if error is None else op.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value, error = None, None
        try:
            value = await (call(step) if isinstance(step, Rpc) else run_io(step.fn))
        except KVStoreError as exc:
            error = exc
