"""The facade's `setup(..., enable_ssd_offload=True)` on a real master: the store lends a
DRAM segment and an SSD segment beside it; what overflows DRAM lands on LOCAL_DISK, reads
back bit-exact (counted by `get_offload_rpc_read_count`) and is promoted back to MEMORY
after reads (the flow of Mooncake's test_promotion_on_hit.py, small and fast)."""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvstore.compat.mooncake import MooncakeDistributedStore
from kvstore.compat.mooncake_ssd import ENV_LIMIT, ENV_PATH, MIN_BYTES
from kvstore.types import Tier
from tests.cluster import Cluster, cluster_fixture

pytestmark = pytest.mark.timeout(120)
cluster = cluster_fixture(nodes=0)
MiB = 1 << 20
BAD = -600
OBJ, N = 256 << 10, 160  # the overflow test's objects: 40 MiB into a 16 MiB DRAM segment


def _setup(s: MooncakeDistributedStore, address: str, segment: int, *ssd: object) -> int:
    return s.setup("localhost", "P2PHANDSHAKE", segment, 4 * MiB, "tcp", "", address, None, *ssd)


def _wait(cond: Callable[[], object], timeout_s: float = 30.0) -> object:
    """Poll `cond` (state another process changes) until it is truthy; fail after."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {cond}")


def _types(s: MooncakeDistributedStore, keys: list[str]) -> dict[str, set[str]]:
    descs = s.batch_get_replica_desc(keys)
    return {k: {"MEMORY" if d.is_memory_replica() else "LOCAL_DISK" for d in descs.get(k, [])
                if d.is_memory_replica() or d.is_local_disk_replica()} for k in keys}  # fmt: skip


@pytest.fixture
def offload_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "offload"
    d.mkdir()
    yield d
    assert list(d.iterdir()) == []  # close() removed the store's own directory


def test_overflow_lands_on_local_disk_reads_back_and_is_promoted(
    cluster: Cluster, offload_dir: Path
) -> None:
    s = MooncakeDistributedStore()
    assert s.get_offload_rpc_read_count() == 0  # before setup
    assert _setup(s, cluster.address, 16 * MiB, True, str(offload_dir)) == 0
    (mine,) = list(offload_dir.iterdir())  # a directory of this store's own
    assert (mine / "node.json").exists()
    ssd = [g for g in cluster.stats().segments if g.tier == Tier.SSD]
    assert [g.capacity for g in ssd] == [max(4 * 16 * MiB, MIN_BYTES)]
    try:
        # 2.5x the DRAM, in objects small beside the room left under its high watermark
        # (5%): promotion needs room there
        ref = {f"ssd{i}": os.urandom(OBJ - 16 * i) for i in range(N)}
        for k, v in ref.items():
            assert s.put(k, v) == 0
        keys = list(ref)
        # the master's offloads run on the store's node: wait until none is in flight
        _wait(lambda: cluster.stats().moves_in_flight == 0)
        # and until the writer's leases on what it put ended: until then a get may be
        # served from where the put wrote it (kvstore.master.writerleases), which the
        # master neither counts as a read of the disk copy nor towards promotion
        _wait(lambda: cluster.stats().writer_leases == 0)
        types = _types(s, keys)
        assert all(types.values()), types  # every key is MEMORY or LOCAL_DISK, none lost
        cold = [k for k, t in types.items() if t == {"LOCAL_DISK"}]
        assert cold and any(t == {"MEMORY"} for t in types.values()), types
        # a LOCAL_DISK-only key read `promote_after` times gets a MEMORY replica again,
        # and is then served from it: the read count stays
        key = cold[0]
        _wait(lambda: s.get(key) == ref[key] and "MEMORY" in _types(s, [key])[key])
        before = s.get_offload_rpc_read_count()
        assert before >= 1
        assert s.get(key) == ref[key]
        assert s.get_offload_rpc_read_count() == before
        # everything back bit-exact, one at a time and batched into a registered buffer;
        # each read of a LOCAL_DISK-only key is counted (and a key whose DRAM replica
        # the master dropped meanwhile)
        types = _types(s, keys)
        assert all(s.get(k) == ref[k] for k in keys)
        on_disk = sum(t == {"LOCAL_DISK"} for t in types.values())
        assert before + N >= s.get_offload_rpc_read_count() >= before + on_disk > before
        buf = (ctypes.c_ubyte * (N * OBJ))()
        base = ctypes.addressof(buf)
        assert s.register_buffer(base, N * OBJ) == 0
        got = s.batch_get_into(keys, [base + i * OBJ for i in range(N)], [OBJ] * N)
        assert got == [len(ref[k]) for k in keys]
        assert all(
            bytes(buf[i * OBJ : i * OBJ + len(ref[k])]) == ref[k] for i, k in enumerate(keys)
        )
        assert s.unregister_buffer(base) == 0
        assert s.get_offload_rpc_read_count() > before + on_disk
        stats = cluster.stats()
        assert stats.promotions >= 1 and stats.failed_moves == 0
    finally:
        for k in [f"ssd{i}" for i in range(N)]:
            s.remove(k, True)
        assert s.close() == 0
    assert not mine.exists()


def test_small_workload_stays_in_memory(cluster: Cluster, offload_dir: Path) -> None:
    s = MooncakeDistributedStore()
    assert _setup(s, cluster.address, 8 * MiB, True, str(offload_dir)) == 0
    keys = [f"small{i}" for i in range(16)]
    assert all(s.put(k, k.encode() * 64) == 0 for k in keys)
    assert set(map(frozenset, _types(s, keys).values())) == {frozenset({"MEMORY"})}
    assert all(s.get(k) == k.encode() * 64 for k in keys)
    assert s.get_offload_rpc_read_count() == 0
    assert s.remove_all(True) >= 0 and s.close() == 0


def test_path_and_size_from_mooncake_environment(
    cluster: Cluster, offload_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_PATH, str(offload_dir))
    monkeypatch.setenv(ENV_LIMIT, str(16 * MiB))
    s = MooncakeDistributedStore()
    config = {"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
              "global_segment_size": str(4 * MiB), "local_buffer_size": str(MiB),
              "master_server_addr": cluster.address, "enable_ssd_offload": "true"}  # fmt: skip
    assert s.setup(config) == 0  # the dict form: Mooncake's values are strings
    assert len(list(offload_dir.iterdir())) == 1
    ssd = [g.capacity for g in cluster.stats().segments if g.tier == Tier.SSD]
    assert ssd == [16 * MiB]
    assert s.close() == 0


def test_bad_offload_directories_are_codes_and_leave_nothing(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_PATH, raising=False)
    a_file = tmp_path / "a_file"
    a_file.write_bytes(b"x")
    segments = len(cluster.stats().segments)
    s = MooncakeDistributedStore()
    for bad in (
        (True,),  # no path argument, no $MOONCAKE_OFFLOAD_FILE_STORAGE_PATH
        (True, str(tmp_path / "missing")),
        (True, "relative/dir"),
        (True, str(tmp_path / ".." / tmp_path.name)),
        (True, str(a_file)),
        (True, "/proc/self"),  # a directory no one can create files in
        ("maybe", str(tmp_path)),
        (True, 42),
    ):
        assert _setup(s, cluster.address, 4 * MiB, *bad) == BAD, bad
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]
    assert len(cluster.stats().segments) == segments  # nothing was lent
    # an unreachable master: the store's SSD directory goes again
    (tmp_path / "ok").mkdir()
    assert _setup(s, "127.0.0.1:1", 4 * MiB, True, str(tmp_path / "ok")) < 0
    assert list((tmp_path / "ok").iterdir()) == []
    # the store is still usable: a good setup after the failed ones
    assert _setup(s, cluster.address, 4 * MiB, False, str(tmp_path / "missing")) == 0
    assert s.get_offload_rpc_read_count() == 0 and s.close() == 0


def test_client_config_ssd_options_are_checked() -> None:
    from kvstore.client.config import ClientConfig
    from kvstore.errors import BadRequestError

    for bad in ({"ssd_bytes": -1}, {"ssd_bytes": MiB}, {"ssd_bytes": MiB, "ssd_dir": "/tmp"}):
        with pytest.raises(BadRequestError):
            ClientConfig(master="127.0.0.1:1", **bad)  # type: ignore[arg-type]
    ok = ClientConfig(master="127.0.0.1:1", segment_bytes=MiB, ssd_dir="/tmp", ssd_bytes=MiB)
    assert (ok.ssd_dir, ok.ssd_bytes) == ("/tmp", MiB)
