"""The step drivers: results flow back, errors are thrown into the operation."""

from __future__ import annotations

import asyncio

import pytest

from kvstore.client import Client, PutOptions
from kvstore.client.steps import Io, Op, Rpc, run_async, run_sync
from kvstore.errors import BadRequestError, UnavailableError
from kvstore.types import Tier


def _op(log: list[str]) -> Op[str]:
    reply = yield Rpc("First", 1)
    log.append(f"got {reply}")
    doubled = yield Io(lambda: reply * 2)
    try:
        yield Rpc("Fails", doubled)
    except UnavailableError as exc:
        log.append(f"caught {exc}")
        yield Rpc("Cleanup", None)
        return "cleaned"
    return "unreachable"


def _call(step: Rpc) -> object:
    if step.method == "Fails":
        raise UnavailableError(f"down ({step.request})")
    return 21 if step.method == "First" else None


def test_run_sync_threads_values_and_errors() -> None:
    log: list[str] = []
    assert run_sync(_op(log), _call) == "cleaned"
    assert log == ["got 21", "caught down (42)"]


def test_run_async_matches_run_sync() -> None:
    log: list[str] = []

    async def call(step: Rpc) -> object:
        return _call(step)

    async def io(fn):  # type: ignore[no-untyped-def]
        return await asyncio.to_thread(fn)

    assert asyncio.run(run_async(_op(log), call, io)) == "cleaned"
    assert log == ["got 21", "caught down (42)"]


def test_uncaught_error_propagates() -> None:
    def op() -> Op[None]:
        yield Rpc("Fails", 0)

    with pytest.raises(UnavailableError):
        run_sync(op(), _call)


def test_failed_write_is_revoked(cluster, fresh) -> None:
    calls: list[str] = []
    with Client(cluster.address, transport="shm") as c:
        before = cluster.stats()

        def counting(step: Rpc) -> object:
            calls.append(step.method)
            return c.call_rpc(step)

        with pytest.raises(BadRequestError, match="cannot be mapped"):  # SSD: TCP only
            c.run(c.ops.put(fresh(), b"v" * 1000, PutOptions(tier=Tier.SSD)), counting)
        assert [m for m in calls if m != "Stats"] == ["PutStart", "PutRevoke"]
        after = cluster.stats()
        assert (after.writing, after.used) == (0, before.used)
        assert not c.exists(fresh())
