"""The tiered pool with real processes: offload, promotion, restart, corruption.

A master and storage nodes run as processes (tests/cluster.py); the node's SSD
segment is the SSD tier's slab file + RocksDB index in its own directory.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kvstore.client import Client
from kvstore.errors import CorruptError, NotFoundError
from kvstore.master.server import grpc_options
from kvstore.types import Tier
from kvstore.v1 import master_pb2, master_pb2_grpc
from tests.cluster import Cluster

pytestmark = pytest.mark.timeout(180)

MIB = 1 << 20


def blob(i: int, size: int = MIB) -> bytes:
    """Distinct, reproducible bytes per index."""
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


def objects(cluster: Cluster, prefix: str = "") -> dict[str, master_pb2.ObjectInfo]:
    """Every object the master lists (all pages)."""
    out: dict[str, master_pb2.ObjectInfo] = {}
    token = ""
    with grpc.insecure_channel(cluster.address, options=grpc_options()) as ch:
        stub = master_pb2_grpc.MasterStub(ch)
        for _ in range(10_000):
            page = stub.ListObjects(
                master_pb2.ListObjectsRequest(page_size=1000, page_token=token, prefix=prefix),
                timeout=5,
            )
            for o in page.objects:
                assert o.key not in out, f"{o.key!r} listed twice"
                out[o.key] = o
            token = page.next_page_token
            if not token:
                return out
    raise AssertionError("listing did not end")


def tiers_of(info: master_pb2.ObjectInfo) -> list[int]:
    return [r.tier for r in info.replicas]


def settled(stats: master_pb2.StatsResponse) -> bool:
    return stats.moves_in_flight == 0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """One node: DRAM 4 MiB, SSD 48 MiB; watermarks 0.75 / 0.5; promotion after 2 reads."""
    opts = {"high_watermark": 0.75, "low_watermark": 0.5, "promote_after": 2}
    with Cluster(
        nodes=1, dram_bytes=4 * MIB, ssd_bytes=48 * MIB, master_options=opts, workdir=tmp_path
    ) as c:
        yield c


def test_dram_overflow_offloads_and_reads_back_bit_exact(cluster: Cluster) -> None:
    with Client(cluster.address) as c:
        for i in range(20):  # 20 MiB into 4 MiB of DRAM
            c.put(f"k{i}", blob(i))
        cluster.wait_stats(settled, 30)
        listed = objects(cluster)
        assert sorted(listed) == sorted(f"k{i}" for i in range(20))  # nothing left the pool
        on_ssd = [k for k, o in listed.items() if int(Tier.SSD) in tiers_of(o)]
        assert len(on_ssd) >= 16  # DRAM holds at most 3 MiB at the high watermark
        for i in range(20):
            assert c.get(f"k{i}") == blob(i)
    stats = cluster.stats()
    assert stats.offloads > 0 and stats.failed_moves == 0 and stats.corrupt_replicas == 0
    ssd = [g for g in stats.segments if g.tier == Tier.SSD]
    assert ssd[0].offloads_in == stats.offloads


def test_repeated_reads_promote_to_dram(cluster: Cluster) -> None:
    with Client(cluster.address) as c:
        for i in range(8):
            c.put(f"p{i}", blob(i), tier=Tier.SSD)  # placed on SSD directly
        key = "p3"
        assert tiers_of(objects(cluster)[key]) == [int(Tier.SSD)]
        assert c.get(key) == blob(3)  # 1st slow read: counted
        assert tiers_of(objects(cluster)[key]) == [int(Tier.SSD)]
        assert c.get(key) == blob(3)  # 2nd: promotion queued, the read is not blocked
        cluster.wait_stats(lambda s: s.promotions >= 1 and settled(s), 20)
        assert tiers_of(objects(cluster)[key]) == [int(Tier.DRAM), int(Tier.SSD)]
        assert c.get(key) == blob(3)  # now served from DRAM, same bytes
        stats = cluster.stats()
        dram = next(g for g in stats.segments if g.tier == Tier.DRAM)
        assert dram.promotions_in == 1 and dram.hits >= 1


def test_node_sigkill_and_restart_keeps_every_committed_ssd_object(cluster: Cluster) -> None:
    with Client(cluster.address) as c:
        for i in range(24):
            c.put(f"r{i}", blob(i, MIB // 2), tier=Tier.SSD if i % 2 else None)
        cluster.wait_stats(settled, 30)
        on_ssd = {k for k, o in objects(cluster).items() if int(Tier.SSD) in tiers_of(o)}
        assert len(on_ssd) >= 12
        node = cluster.kill_node(0)  # SIGKILL: no unmount, no clean close
        cluster.wait_stats(lambda s: not any(g.node_id == node.node_id for g in s.segments), 20)
        cluster.start_node(node_id=node.node_id)  # same id, same SSD directory
        cluster.wait_stats(lambda s: s.complete >= len(on_ssd), 30)
        listed = objects(cluster)
        assert on_ssd <= set(listed)  # 100% of the committed SSD objects are back
        for key in on_ssd:
            i = int(key[1:])
            assert c.get(key) == blob(i, MIB // 2)
        # The master restarted without a journal rebuilds the SSD part from announcements.
        cluster.restart_master()
        cluster.wait_stats(lambda s: s.complete >= len(on_ssd), 30)
        assert on_ssd <= set(objects(cluster))
    with Client(cluster.address) as c:
        for key in sorted(on_ssd):
            assert c.get(key) == blob(int(key[1:]), MIB // 2)
    assert cluster.stats().adopted >= len(on_ssd)


def test_sigkill_mid_offload_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    # A slow move budget keeps offloads in flight when the node dies.
    opts = {"high_watermark": 0.5, "low_watermark": 0.25, "move_bytes_per_s": 2 * MIB}
    with Cluster(
        nodes=1, dram_bytes=8 * MIB, ssd_bytes=48 * MIB, master_options=opts, workdir=tmp_path
    ) as cluster, Client(cluster.address) as c:  # fmt: skip
        for i in range(14):
            c.put(f"m{i}", blob(i, MIB // 2))
        cluster.wait_stats(lambda s: s.moves_in_flight > 0 and s.offloads >= 1, 20)
        before = {k for k, o in objects(cluster).items() if int(Tier.SSD) in tiers_of(o)}
        node = cluster.kill_node(0)
        cluster.wait_stats(lambda s: not any(g.node_id == node.node_id for g in s.segments), 20)
        cluster.start_node(node_id=node.node_id)
        cluster.wait_stats(lambda s: s.complete >= len(before), 30)
        after = objects(cluster)  # raises if a key is listed twice
        assert before <= set(after)
        for key, info in after.items():
            places = [(r.node_id, r.tier) for r in info.replicas]
            assert len(places) == len(set(places))  # no duplicated replica
            assert c.get(key) == blob(int(key[1:]), MIB // 2)  # and never wrong bytes


def test_raw_write_into_the_slab_is_detected_never_served(cluster: Cluster) -> None:
    with Client(cluster.address) as c:
        c.put("victim", blob(7), tier=Tier.SSD)
        c.put("bystander", blob(8), tier=Tier.SSD)
        (loc,) = objects(cluster)["victim"].replicas
        slab = cluster.ssd_dir(cluster.node_procs[0].node_id) / "slab.dat"
        fd = os.open(slab, os.O_WRONLY)
        try:
            os.pwrite(fd, b"\xff" * 64, loc.offset + 1000)  # behind the pool's back
        finally:
            os.close(fd)
        with pytest.raises(CorruptError):
            c.get("victim")
        stats = cluster.stats()
        assert stats.corrupt_replicas == 1
        assert [g.corrupt for g in stats.segments if g.tier == Tier.SSD] == [1]
        with pytest.raises(NotFoundError):  # the bad replica was its only one: gone
            c.get("victim")
        assert c.get("bystander") == blob(8)


def test_corruption_at_rest_is_dropped_when_the_node_reopens(cluster: Cluster) -> None:
    with Client(cluster.address) as c:
        c.put("bad", blob(1), tier=Tier.SSD)
        c.put("good", blob(2), tier=Tier.SSD)
        (loc,) = objects(cluster)["bad"].replicas
        node = cluster.node_procs[0]
        assert cluster.stop_node(0) == 0
        fd = os.open(cluster.ssd_dir(node.node_id) / "slab.dat", os.O_WRONLY)
        try:
            os.pwrite(fd, b"\x00" * 512, loc.offset)
        finally:
            os.close(fd)
        cluster.start_node(node_id=node.node_id)
        cluster.wait_stats(lambda s: s.complete >= 1, 20)
        assert sorted(objects(cluster)) == ["good"]  # verified at open: never announced
        assert c.get("good") == blob(2)


def test_mooncake_offload_in_evict_flow_reads_everything_back(tmp_path: Path) -> None:
    """Mooncake's test_ssd_offload_in_evict flow, scaled down: put 4x DRAM, read all back."""
    with Cluster(
        nodes=1, dram_bytes=24 * MIB, ssd_bytes=128 * MIB, workdir=tmp_path
    ) as cluster, Client(cluster.address) as c:  # fmt: skip
        for i in range(96):
            c.put(f"mc{i}", blob(i))
        got = sum(c.get(f"mc{i}") == blob(i) for i in range(96))
        assert got == 96


def test_another_nodes_ssd_directory_is_refused(cluster: Cluster) -> None:
    owner = cluster.node_procs[0].node_id
    args = ["--ssd-dir", str(cluster.ssd_dir(owner)), "--ssd-mib", "48"]
    thief = cluster.start_node(wait=False, node_id="thief", extra=args)
    assert thief.proc.wait(30) != 0
    assert f"belongs to node {owner!r}" in cluster.log_tail(thief.log)


def test_missing_ssd_directory_is_a_typed_error(cluster: Cluster, tmp_path: Path) -> None:
    args = ["--ssd-dir", str(tmp_path / "nowhere"), "--ssd-mib", "4"]
    node = cluster.start_node(wait=False, node_id="lost", extra=args)
    assert node.proc.wait(30) != 0
    assert "does not exist" in cluster.log_tail(node.log)


def test_graceful_stop_then_restart_readopts(cluster: Cluster) -> None:
    with Client(cluster.address) as c:
        c.put("stays", blob(5), tier=Tier.SSD)
        node = cluster.node_procs[0]
        assert cluster.stop_node(0) == 0  # SIGTERM: unmounts; the index keeps the object
        assert "stays" not in objects(cluster)
        cluster.start_node(node_id=node.node_id)
        cluster.wait_stats(lambda s: s.complete >= 1, 20)
        assert c.get("stays") == blob(5)


def test_restarted_node_reclaims_its_old_dev_shm_files(cluster: Cluster) -> None:
    stale = Path("/dev/shm/kvs-reclaimer-dram-deadbeef")  # left by an old-design run
    other = Path("/dev/shm/kvs-someone-else-dram-deadbeef")
    stale.write_bytes(b"x" * 4096)
    other.write_bytes(b"y")
    try:
        cluster.start_node(node_id="reclaimer")
        assert not stale.exists()
        assert other.exists()  # another node's file is not ours to remove
    finally:
        stale.unlink(missing_ok=True)
        other.unlink(missing_ok=True)


def _hbm_cascade(tmp_path: Path, device: str, ssd: bool = True) -> None:
    opts = {"high_watermark": 0.75, "low_watermark": 0.5}
    ssd_bytes = 32 * MIB if ssd else 0
    with Cluster(
        nodes=0, dram_bytes=4 * MIB, ssd_bytes=ssd_bytes, master_options=opts, workdir=tmp_path
    ) as cluster:
        node = cluster.start_node(wait=False, extra=["--hbm-mib", "2", "--hbm-device", device])
        node.segments += 1
        cluster.wait_node(node)
        with Client(cluster.address) as c:
            n = 12 if ssd else 5  # without SSD: what HBM + DRAM hold
            for i in range(n):  # placement takes the fastest tier first: HBM
                c.put(f"h{i}", blob(i))
            cluster.wait_stats(settled, 30)
            for i in range(n):
                assert c.get(f"h{i}") == blob(i)
        stats = cluster.stats()
        by_tier = {g.tier: g for g in stats.segments}
        assert set(by_tier) == ({Tier.HBM, Tier.DRAM, Tier.SSD} if ssd else {Tier.HBM, Tier.DRAM})
        assert by_tier[Tier.HBM].bytes_in > 0  # puts landed in device memory
        assert by_tier[Tier.DRAM].offloads_in > 0
        assert not ssd or by_tier[Tier.SSD].offloads_in > 0
        assert stats.failed_moves == 0


def test_hbm_segment_on_the_cpu_device_offloads_to_dram_then_ssd(tmp_path: Path) -> None:
    _hbm_cascade(tmp_path, "cpu")


@pytest.mark.gpu
def test_hbm_segment_on_cuda_offloads_to_dram_then_ssd(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    # The device image may lack rocksdict (the SSD index): then HBM -> DRAM only.
    _hbm_cascade(tmp_path, "cuda", ssd=importlib.util.find_spec("rocksdict") is not None)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (root only: skipped where mounting is not allowed)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_full_ssd_directory_is_a_typed_error_at_start(cluster: Cluster, small_fs: Path) -> None:
    args = ["--ssd-dir", str(small_fs), "--ssd-mib", "64"]
    node = cluster.start_node(wait=False, node_id="full", extra=args)
    assert node.proc.wait(30) != 0
    assert "no space left on device" in cluster.log_tail(node.log)
    assert "Traceback" not in cluster.log_tail(node.log, 20_000)


def test_a_client_lends_device_memory_and_its_puts_land_there(cluster: Cluster) -> None:
    """What a serving node does with --hbm-segment-bytes (cpu device here)."""
    with (
        Client(cluster.address, hbm_segment_bytes=2 * MIB, hbm_device="cpu") as lender,
        Client(cluster.address, transport="tcp") as reader,
    ):
        lender.put("on-hbm", blob(4, 4096))
        (loc,) = objects(cluster)["on-hbm"].replicas
        assert (loc.node_id, loc.tier) == (lender.config.id, int(Tier.HBM))
        assert reader.get("on-hbm") == blob(4, 4096)
