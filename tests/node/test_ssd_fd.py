"""Same-host peers read and write an SSD segment through the slab file's own fd
(kvstore.transfer.file): no TCP copy; TCP where the node hands no fd out."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvstore.client import Client
from kvstore.errors import BadRequestError, PermissionDeniedError
from kvstore.tiers.direct_io import BUFFERED, DIRECT
from kvstore.tiers.shm import FdServer
from kvstore.tiers.ssd_index import checksum_of
from kvstore.tiers.ssd_segment import SsdSegment
from kvstore.transfer.base import SegmentDescriptor, TransferOp, TransferRequest, local_host_id
from kvstore.transfer.file import FileEngine
from kvstore.transfer.select import AutoEngine
from kvstore.transfer.tcp_server import ServerConfig, TransferServer
from kvstore.types import Tier
from tests.cluster import Cluster
from tests.node.test_pool_tiers import objects

pytestmark = pytest.mark.timeout(90)
MIB = 1 << 20


def unaligned(data: bytes) -> memoryview:
    """`data` in a buffer whose start is not page-aligned (as most callers' are)."""
    raw = np.zeros(len(data) + 4096 + 1, np.uint8)
    start = 1 + (-raw.ctypes.data - 1) % 4096  # one byte past a page boundary
    view = memoryview(raw[start : start + len(data)])
    view[:] = data
    return view


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[SsdSegment, FdServer]]:
    seg = SsdSegment(str(tmp_path), 16 * MIB, "n1")
    seg.recover()
    fds = FdServer()
    fds.start()
    seg.serve(fds)
    try:
        yield seg, fds
    finally:
        seg.close()
        fds.stop()


def descriptor(seg: SsdSegment, fds: FdServer, endpoint: str = "") -> SegmentDescriptor:
    return SegmentDescriptor(
        seg.name, seg.size, local_host_id(), endpoint=endpoint, shm_socket=fds.address, file=True
    )


def test_cluster_ssd_puts_and_gets_go_by_the_slab_fd(tmp_path: Path) -> None:
    sizes = [5000, MIB + 123, 3 * MIB]
    blobs = [os.urandom(n) for n in sizes]
    with Cluster(nodes=1, ssd_bytes=32 * MIB, workdir=tmp_path) as cluster:
        (seg,) = [g for g in cluster.stats().segments if g.tier == Tier.SSD]
        assert seg.shm  # mounted as handing its fd to same-host peers
        with Client(cluster.address) as c:
            for i, data in enumerate(blobs):
                c.put(f"k{i}", unaligned(data), tier=Tier.SSD)
            engines = c._data.engine._engines  # type: ignore[attr-defined]
            assert set(engines) == {"file"}  # never TCP: every byte went by the fd
            for i, data in enumerate(blobs):
                assert c.get(f"k{i}") == data
                aligned = np.zeros(len(data), np.uint8)  # numpy: page-aligned here
                c.get_into(f"k{i}", aligned)
                assert aligned.tobytes() == data
        listed = objects(cluster)
        slab = cluster.ssd_dir(cluster.node_procs[0].node_id) / "slab.dat"
        with open(slab, "rb") as f:  # and they are in the node's slab file
            for i, data in enumerate(blobs):
                # (two reads may have promoted it: a DRAM replica beside)
                (replica,) = [r for r in listed[f"k{i}"].replicas if r.tier == Tier.SSD]
                f.seek(replica.offset)
                assert f.read(len(data)) == data


def test_a_node_started_with_no_ssd_fd_is_reached_over_tcp(tmp_path: Path) -> None:
    with Cluster(nodes=0, ssd_bytes=16 * MIB, workdir=tmp_path) as cluster:
        cluster.start_node(extra=["--no-ssd-fd"])
        (seg,) = [g for g in cluster.stats().segments if g.tier == Tier.SSD]
        assert not seg.shm
        with Client(cluster.address) as c:
            c.put("k", b"x" * 10000, tier=Tier.SSD)
            assert c.get("k") == b"x" * 10000
            assert "file" not in c._data.engine._engines  # type: ignore[attr-defined]


def test_a_refused_fd_falls_back_to_tcp(tmp_path: Path) -> None:
    """A node whose fd server says no (an older node, another uid): the request goes
    to its TCP endpoint, and the refusal is remembered (asked once)."""
    seg = SsdSegment(str(tmp_path), 4 * MIB, "n1")
    seg.recover()
    asked: list[str] = []

    def refuse(name: str, capability: bytes, uid: int) -> None:
        asked.append(name)
        raise PermissionDeniedError("not you")

    fds = FdServer(authorize=refuse)
    fds.start()
    seg.serve(fds)
    data = os.urandom(3 * 4096 + 17)
    back = bytearray(len(data))
    with TransferServer(ServerConfig()) as server, AutoEngine() as engine:
        server.expose_store(seg.name, seg)
        desc = descriptor(seg, fds, server.endpoint)
        src, dst = engine.register("src", bytearray(data)), engine.register("dst", back)
        engine.write(desc, 8192, len(data), src, timeout=10)
        engine.read(desc, 8192, len(data), dst, timeout=10)
        assert bytes(back) == data
        assert set(engine._engines) == {"file", "tcp"} and asked == [seg.name]
    seg.close()
    fds.stop()


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "buffered"])
def test_file_engine_moves_exact_bytes_and_keeps_neighbours(tmp_path: Path, direct: bool) -> None:
    seg = SsdSegment(str(tmp_path), 16 * MIB, "n1", direct_io=direct)
    seg.recover()
    fds = FdServer()
    fds.start()
    seg.serve(fds)
    desc = descriptor(seg, fds)
    first, second = os.urandom(2 * MIB + 5), os.urandom(4096)
    with FileEngine() as engine:
        a = engine.register("a", unaligned(first))
        b = engine.register("b", unaligned(second))
        after = 2 * MIB + 4096  # the page after `first`'s padded tail
        engine.write(desc, after, len(second), b, timeout=10)
        engine.write(desc, 0, len(first), a, timeout=10)  # its padding must stop short
        (slab,) = engine._slabs.values()  # type: ignore[attr-defined]
        assert slab.mode == (DIRECT if seg.io_mode == DIRECT else BUFFERED)
        out1, out2 = bytearray(len(first)), bytearray(len(second))
        engine.read(desc, 0, len(first), engine.register("o1", out1), timeout=10)
        engine.read(desc, after, len(second), engine.register("o2", out2), timeout=10)
        assert bytes(out1) == first and bytes(out2) == second
    with open(tmp_path / "slab.dat", "rb") as f:
        assert f.read(len(first)) == first
    seg.close()
    fds.stop()


def test_persist_of_an_fd_written_object_trusts_its_checksum_and_reopen_checks_it(
    tmp_path: Path, served: tuple[SsdSegment, FdServer]
) -> None:
    """The node never saw the bytes: PERSIST records the committed checksum without
    reading them back. A wrong one is not served later: reopening drops it."""
    seg, fds = served
    good, bad = os.urandom(8192), os.urandom(8192)
    with FileEngine() as engine:
        desc = descriptor(seg, fds)
        engine.write(desc, 0, len(good), engine.register("g", bytearray(good)), timeout=10)
        engine.write(desc, 8192, len(bad), engine.register("b", bytearray(bad)), timeout=10)
    assert seg.persist("good", 0, len(good), checksum_of(good)) == checksum_of(good)
    seg.persist("lie", 8192, len(bad), checksum_of(good))  # a writer that lied
    assert set(seg.indexed()) == {"good", "lie"}
    seg.close()
    reopened = SsdSegment(str(tmp_path), 16 * MIB, "n1")
    try:
        survivors = reopened.recover()
        assert [s.key for s in survivors] == ["good"] and reopened.dropped_at_open == 1
    finally:
        reopened.close()


def test_a_stale_tcp_record_at_the_same_offset_does_not_fail_a_later_fd_put(
    served: tuple[SsdSegment, FdServer],
) -> None:
    """A TCP write that was never committed leaves a record; an fd write at the same
    offset later is persisted by what is on disk, not by that record."""
    seg, fds = served
    old, new = os.urandom(4096), os.urandom(4096)
    seg.write_range(0, len(old), lambda view: view.__setitem__(slice(None), old))
    with FileEngine() as engine:
        desc = descriptor(seg, fds)
        engine.write(desc, 0, len(new), engine.register("n", bytearray(new)), timeout=10)
    assert seg.persist("k", 0, len(new), checksum_of(new)) == checksum_of(new)


def test_file_engine_refuses_what_it_cannot_reach(served: tuple[SsdSegment, FdServer]) -> None:
    seg, fds = served
    with FileEngine() as engine:
        buf = engine.register("x", bytearray(4096))
        elsewhere = SegmentDescriptor(seg.name, seg.size, "another-host", shm_socket=fds.address,
                                      file=True)  # fmt: skip
        with pytest.raises(BadRequestError, match="not a slab on this host"):
            engine.submit([TransferRequest(TransferOp.READ, elsewhere, 0, 4096, buf)])
        desc = descriptor(seg, fds)
        (err,) = engine.submit([TransferRequest(TransferOp.READ, desc, 100, 4096, buf)]).wait(5)
        assert isinstance(err, BadRequestError) and "not aligned" in str(err)
