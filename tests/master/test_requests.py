"""The client author's requests: lease-free lookups, the shm flag of a segment, the
complete-object count, and `python -m kvstore.master` as a process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from kvstore.errors import NotFoundError, NotReadyError
from kvstore.master.config import MasterConfig
from kvstore.master.journal import RocksJournal
from kvstore.master.metadata import MasterState
from kvstore.master.model import Endpoint, ObjectMeta, PutItem
from kvstore.master.server import serve
from kvstore.types import ObjectKey, Tier
from kvstore.v1 import common_pb2, master_pb2, master_pb2_grpc

from .conftest import FakeClock

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]


def _put(st: MasterState, key: str, size: int = 64, commit: bool = True) -> None:
    assert isinstance(st.put_start("w", "", [PutItem(ObjectKey(key), size)])[0], list)
    if commit:
        assert st.put_end("w", [key]) == [None]


def test_peek_has_no_side_effect(state: MasterState, clock: FakeClock) -> None:
    _put(state, "a")
    _put(state, "b", commit=False)
    before = (state.counters.hits, state.counters.misses, list(state.groups.oldest_first()))
    found = state.peek(["a", "b", "zz"])
    assert isinstance(found[0], ObjectMeta) and found[0].size == 64
    assert isinstance(found[1], NotReadyError) and isinstance(found[2], NotFoundError)
    assert (state.counters.hits, state.counters.misses, list(state.groups.oldest_first())) == before
    assert state.objects["a"].lease_until == 0.0
    assert state.remove(["a"]) == [None]  # nothing leased it
    state.check_integrity()


def test_shm_flag_kept_updated_and_journaled(tmp_path: Path, clock: FakeClock) -> None:
    cfg = MasterConfig(db_path=str(tmp_path / "db"))
    st = MasterState(cfg, clock=clock, journal=RocksJournal(cfg.db_path or ""))
    st.register_node("n", Endpoint("127.0.0.1:1", "h"))
    assert st.mount_segment("n", "d", Tier.DRAM, 4096, shm=True).shm is True
    assert st.mount_segment("n", "s", Tier.SSD, 4096).shm is False
    st.mount_segment("n", "s", Tier.SSD, 4096, shm=True)  # same geometry: flag updated
    st.journal.close()
    again = MasterState(cfg, clock=clock, journal=RocksJournal(cfg.db_path or ""))
    again.restore()
    assert {k[1]: s.shm for k, s in again.registry.segments.items()} == {"d": True, "s": True}
    again.check_integrity()
    again.journal.close()


def test_service_no_lease_shm_and_complete() -> None:
    async def body() -> None:
        handle = await serve(MasterConfig(listen="127.0.0.1:0"))
        try:
            async with grpc.aio.insecure_channel(handle.address) as ch:
                await _exercise(master_pb2_grpc.MasterStub(ch), handle.state)
        finally:
            await handle.stop(0)

    asyncio.run(body())


async def _exercise(stub: master_pb2_grpc.MasterStub, state: MasterState) -> None:
    await stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id="n"))
    for name, shm in (("d", True), ("s", False)):
        await stub.MountSegment(
            master_pb2.MountSegmentRequest(
                node_id="n", segment=name, tier=common_pb2.TIER_DRAM, capacity=1 << 20, shm=shm
            )
        )
    items = [master_pb2.PutStartItem(key=k, size=100) for k in ("a", "b")]
    await stub.PutStart(master_pb2.PutStartRequest(client_id="c", items=items))
    await stub.PutEnd(master_pb2.PutEndRequest(client_id="c", keys=["a"]))
    req = master_pb2.BatchLookupRequest(keys=["a", "b"], lease_ttl_ms=9000, no_lease=True)
    peek = await stub.BatchLookup(req)
    assert peek.lease_ttl_ms == 0 and peek.results[0].size == 100
    assert peek.results[1].status.code == common_pb2.ERROR_CODE_NOT_READY
    assert state.objects["a"].lease_until == 0.0 and state.counters.hits == 0
    stats = await stub.Stats(master_pb2.StatsRequest())
    assert {g.segment: g.shm for g in stats.segments} == {"d": True, "s": False}
    assert (stats.objects, stats.writing, stats.complete) == (2, 1, 1)


def _master(*args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "kvstore.master", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def test_module_entry_point_serves_and_stops_on_sigterm() -> None:
    proc = _master(
        "--listen", "127.0.0.1:0", "--set", "tick_interval_s=0.05", "--set", "max_batch=2"
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.startswith("kvstore master listening on 127.0.0.1:"), line
        address = line.split()[4]
        with grpc.insecure_channel(address) as ch:
            stub = master_pb2_grpc.MasterStub(ch)
            assert stub.Stats(master_pb2.StatsRequest(), timeout=10).master_epoch == line.split()[6]
            with pytest.raises(grpc.RpcError) as err:  # max_batch=2 took effect
                stub.BatchLookup(master_pb2.BatchLookupRequest(keys=["a", "b", "c"]), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_module_entry_point_rejects_unknown_setting() -> None:
    proc = _master("--set", "no_such_knob=1")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and b"bad --set 'no_such_knob=1'" in err
