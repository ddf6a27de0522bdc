"""Extent leases and the location cache when things go wrong, with real processes: a
lease that ended under the client, a cached location whose space was overwritten, a
writer killed with bytes in its extent but no commit."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from kvstore.client import Client
from kvstore.client.datapath import Transfer
from kvstore.errors import NotFoundError, TooLargeError
from kvstore.transfer.base import TransferOp
from tests.cluster import REPO, Cluster, _read_line, child_env

TTL_S = 1.5  # the master's extent lease here; clients use an extent while > timeout_s is left
TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    options = {"extent_ttl_s": TTL_S}
    workdir = tmp_path_factory.mktemp("extents")
    with Cluster(nodes=1, dram_bytes=32 << 20, master_options=options, workdir=workdir) as c:
        yield c


def allocated(pool: Cluster) -> int:
    return sum(s.used for s in pool.stats().segments)


def test_a_lease_that_ended_falls_back_to_putstart(pool: Cluster) -> None:
    with Client(pool.address, timeout_s=TIMEOUT_S, location_cache_entries=0) as c:
        c.put("first", b"1" * 5000)
        holder = c._ctx.extents
        assert holder.grants == 1
        lease = holder._lease
        assert lease is not None
        lease.usable_until = float("inf")  # the client believes its lease still holds...
        pool.wait_stats(lambda s: s.extents == 0, timeout_s=10)  # ...the master ended it
        c.put("second", b"2" * 5000)  # CommitExtent: NotFound -> PutStart / PutEnd
        assert holder.fallbacks == 1 and holder.current() == 0
        assert c.get("first") == b"1" * 5000 and c.get("second") == b"2" * 5000
        stats = pool.stats()
        assert stats.complete == 2 and stats.writing == 0 and stats.extents == 0
        assert allocated(pool) == 5056 * 2  # two objects, nothing placed twice
        c.put("third", b"3")  # the next put gets a fresh extent
        assert holder.grants == 2
        for key in ("first", "second", "third"):
            assert c.remove(key)


def test_a_cached_location_overwritten_is_detected(pool: Cluster) -> None:
    with Client(pool.address, timeout_s=5.0) as a, Client(pool.address) as b:
        b.put("shared", b"old" * 1000)
        assert a.get("shared") == b"old" * 1000  # looked up: cached inside its lease
        assert a.get("shared") == b"old" * 1000 and a._ctx.locations.hits == 1
        entry = a._ctx.locations.get("shared")
        assert entry is not None
        assert b.remove("shared", force=True)  # a forced remove breaks the lease...
        loc = entry.replicas[0]
        desc = a._ctx.directory.descriptor(loc)
        junk = memoryview(b"new" * 1000)  # ...and its space is written again
        assert a._ctx.data.run(TransferOp.WRITE, [Transfer(desc, loc.offset, junk)]).errors == [
            None
        ]  # fmt: skip
        with pytest.raises(NotFoundError):  # the cached read fails its check: looked up
            a.get("shared")
        assert a._ctx.locations.stale == 1 and a._ctx.locations.get("shared") is None


def test_get_into_a_cached_location_is_a_copy_and_checked(pool: Cluster) -> None:
    """get_into of a cached same-host location takes no step (reads.read_cached_now): no
    master call; an overwritten one is detected the same way and looked up."""
    out = bytearray(3000)
    with Client(pool.address, timeout_s=5.0) as a, Client(pool.address) as b:
        b.put("into", b"old" * 1000)
        assert a.get_into("into", out) == 3000  # looked up, cached
        calls: list[str] = []
        route = a._route
        a._route = lambda step: calls.append(step.method) or route(step)  # type: ignore[method-assign]
        out[:] = bytes(3000)
        assert a.get_into("into", out) == 3000 and out == b"old" * 1000
        assert calls == [] and a._ctx.locations.hits == 1  # served from the cache, no step
        small = bytearray(10)  # too small for the cached size: the normal path says why
        with pytest.raises(TooLargeError):
            a.get_into("into", small)
        entry = a._ctx.locations.get("into")
        assert entry is not None
        assert b.remove("into", force=True)
        loc = entry.replicas[0]
        desc = a._ctx.directory.descriptor(loc)
        junk = memoryview(b"new" * 1000)
        assert a._ctx.data.run(TransferOp.WRITE, [Transfer(desc, loc.offset, junk)]).errors == [
            None
        ]  # fmt: skip
        with pytest.raises(NotFoundError):  # the copy fails its check: looked up, gone
            a.get_into("into", out)
        assert a._ctx.locations.stale == 1 and a._ctx.locations.get("into") is None
        assert "BatchLookup" in calls


def test_writer_killed_before_its_commit_leaves_nothing(pool: Cluster) -> None:
    before = allocated(pool)
    args = [sys.executable, "-m", "tests.client.writer_child", "hang-extent", pool.address]
    proc = subprocess.Popen(
        [*args, "dying", "300000", "7", str(TIMEOUT_S)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO, env=child_env(),
    )  # fmt: skip
    try:
        _read_line(proc, b"WRITTEN", 30.0)  # its bytes are in its extent, uncommitted
        mid = pool.stats()
        assert mid.extents == 1 and mid.extent_bytes >= 300000 and mid.writing == 0
        with Client(pool.address) as c:
            assert not c.exists("dying")
            proc.kill()
            proc.wait(5)
            after = pool.wait_stats(lambda s: s.extents == 0, timeout_s=10)
            assert not c.exists("dying")
        assert after.extent_bytes == 0 and allocated(pool) == before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()


def test_a_lent_segment_is_reached_by_memcpy_in_place(pool: Cluster) -> None:
    """Puts and gets of a client's own segment copy in place: the engine never maps it."""
    value = bytes(range(256)) * 1024
    with Client(pool.address, segment_bytes=8 << 20) as lender, Client(pool.address) as other:
        lender.put("mine", value)
        assert pool.holders("mine") == [lender.config.id]  # its puts prefer its segment
        assert lender.get("mine") == value
        engine = lender._data.engine
        shm = engine if hasattr(engine, "_maps") else engine.engine("shm")  # type: ignore[attr-defined]
        assert not shm._maps  # no second mapping of its own memory
        assert other.get("mine") == value  # the bytes really are in the lent segment
        assert lender.remove("mine", force=True)  # the other reader holds a lease
