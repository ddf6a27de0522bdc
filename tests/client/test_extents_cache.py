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
from kvstore.errors import CorruptError, NotFoundError, NotReadyError, TooLargeError
from kvstore.transfer.base import TransferOp
from tests.cluster import REPO, Cluster, _read_line, child_env
from tests.threads import in_threads

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


def overwrite_cached(client: Client, key: str, junk: bytes, at: int = 0, ssd: bool = False) -> None:
    """Write `junk` one-sided at `key`'s cached location (+`at`; with `ssd`, its cached
    SSD location, into the slab), as a raw writer reusing its space (or a bad disk)
    would: the cached read's checksum must catch it."""
    entry = client._ctx.locations.get(key, ssd=ssd)
    assert entry is not None and entry.checksum and entry.ssd == ssd
    loc = entry.replicas[0]
    desc = client._ctx.directory.descriptor(loc)
    assert desc is not None
    write = [Transfer(desc, loc.offset + at, memoryview(junk))]
    assert client._ctx.data.run(TransferOp.WRITE, write).errors == [None]


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
        assert b.remove("shared", force=True)  # a forced remove breaks the lease...
        overwrite_cached(a, "shared", b"new" * 1000)  # ...and its space is written again
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
        assert b.remove("into", force=True)
        overwrite_cached(a, "into", b"new" * 1000)
        with pytest.raises(NotFoundError):  # the copy fails its check: looked up, gone
            a.get_into("into", out)
        assert a._ctx.locations.stale == 1 and a._ctx.locations.get("into") is None
        assert "BatchLookup" in calls


def test_a_writer_reads_its_puts_back_under_its_writer_lease(pool: Cluster) -> None:
    """kvstore.master.writerleases through real processes: the writer's get of what it
    just put needs no master call; another client may not remove it meanwhile (the
    writer's own remove goes through); a forced remove whose space is written again is
    caught by the cached read's check, never served; an evicted key is a tombstone."""
    with Client(pool.address, timeout_s=TIMEOUT_S) as w, Client(pool.address) as other:
        w.put("wl-mine", b"v1" * 2000)
        calls: list[str] = []
        route = w._route
        w._route = lambda step: calls.append(step.method) or route(step)  # type: ignore[method-assign]
        assert w.get("wl-mine") == b"v1" * 2000 and calls == []  # read where it was written
        assert w._ctx.locations.hits == 1
        with pytest.raises(NotReadyError, match="leased"):
            other.remove("wl-mine")
        assert other.exists("wl-mine")  # refused: nothing changed (a query takes no lease)
        assert w.remove("wl-mine") and w._ctx.locations.get("wl-mine") is None
        w.put("wl-forced", b"a" * 3000)
        assert w._ctx.locations.get("wl-forced") is not None  # cached by its writer lease
        assert other.remove("wl-forced", force=True)  # an admin's remove breaks the lease...
        overwrite_cached(w, "wl-forced", b"b" * 3000)  # ...and its space is written again
        with pytest.raises(NotFoundError):  # the cached read fails its check: looked up
            w.get("wl-forced")
        assert w._ctx.locations.stale == 1
        other.put("wl-forced", b"c" * 3000)  # an explicit remove leaves no tombstone
        assert other.remove("wl-forced")
        w.put("wl-evicted", b"e" * 3000)
        for i in range(40):  # 40 MiB into a 32 MiB pool: the oldest objects are evicted
            other.put(f"wl-fill{i}", bytes([i]) * (1 << 20))
        assert not other.exists("wl-evicted")
        with pytest.raises(NotReadyError, match="retry in"):  # dropped under the lease:
            other.put("wl-evicted", b"f" * 3000)  # a tombstone while its writer may read
        try:  # its writer reads what it wrote, or (space reused) a lookup: never other bytes
            assert w.get("wl-evicted") == b"e" * 3000
        except NotFoundError:
            assert w._ctx.locations.stale == 2
        w.put("wl-evicted", b"g" * 3000)  # its writer may put it again
        assert other.get("wl-evicted") == b"g" * 3000
    with Client(pool.address, timeout_s=TIMEOUT_S) as w, Client(pool.address) as other:
        w.put("wl-ended", b"i" * 3000)
        with pytest.raises(NotReadyError):
            other.remove("wl-ended")
        w.end_writer_leases()  # and forgets what its cache knew
        assert other.remove("wl-ended")
        with pytest.raises(NotFoundError):
            w.get("wl-ended")
    with Client(pool.address, timeout_s=TIMEOUT_S) as w:
        w.put("wl-closed", b"h" * 3000)
        assert pool.stats().writer_leases >= 1
    with Client(pool.address) as other:  # its writer closed: its leases ended with it
        assert pool.stats().writer_leases == 0
        assert other.remove("wl-closed")
        for key in ("wl-evicted", *(f"wl-fill{i}" for i in range(40))):
            other.remove(key, force=True)


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


def test_copy_and_checksum_spread_over_threads_match_one_thread() -> None:
    """reads.copy_hashed_all: the lanes path (one large object by chunks, several by
    runs of objects) lands the same bytes and the same xxh3 as one thread, uses the
    helper threads, and an out-of-segment range is its own error, not a crash."""
    import threading

    import numpy as np
    import xxhash

    from kvstore.client import reads
    from kvstore.errors import TransferError
    from kvstore.types import Location, Tier

    rng = np.random.default_rng(7)
    segment = memoryview(rng.integers(0, 256, 40 << 20, np.uint8).tobytes())
    sizes = [16 << 20, 1 << 20, (3 << 20) + 17, 5, 2 << 20, (7 << 20) + 4095]
    offsets = np.cumsum([0, *sizes[:-1]]).tolist()
    locs = [Location("n", Tier.DRAM, "seg", off, n) for off, n in zip(offsets, sizes, strict=True)]
    want = [
        xxhash.xxh3_64_intdigest(segment[o : o + n]) for o, n in zip(offsets, sizes, strict=True)
    ]
    seen: set[str] = set()
    copy = reads._copy

    def spy(dst: memoryview, src: memoryview) -> None:
        seen.add(threading.current_thread().name)
        copy(dst, src)

    reads._copy = spy  # type: ignore[assignment]
    try:
        for lanes in (1, 2, 3):
            for jobs in ([0], [1, 3], list(range(len(sizes)))):
                outs = [memoryview(bytearray(sizes[j])) for j in jobs]
                got = reads.copy_hashed_all(
                    [(outs[k], segment, locs[j]) for k, j in enumerate(jobs)], lanes
                )
                assert got == [want[j] for j in jobs], (lanes, jobs)
                for k, j in enumerate(jobs):
                    assert outs[k] == segment[offsets[j] : offsets[j] + sizes[j]]
    finally:
        reads._copy = copy  # type: ignore[assignment]
    assert any(name.startswith("kvstore-copy") for name in seen)  # the lanes did copy
    outside = Location("n", Tier.DRAM, "seg", (40 << 20) - 10, 8 << 20)
    out = memoryview(bytearray(8 << 20))
    [err, ok] = reads.copy_hashed_all([(out, segment, outside), (out[:5], segment, locs[3])], 2)
    assert isinstance(err, TransferError) and ok == want[3]
    # the facade's scatter reads (copy_parts_hashed): one replica across several views
    n, off = sizes[0], offsets[0]
    for cuts in ([n], [5, (1 << 20) - 5, n - (1 << 20)], [n - 1, 1]):
        for lanes in (1, 3):
            views = [memoryview(bytearray(c)) for c in cuts]
            assert reads.copy_parts_hashed(views, segment, off, True, lanes) == want[0]
            assert b"".join(bytes(v) for v in views) == segment[off : off + n]
            assert reads.copy_parts_hashed(views, segment, off, False, lanes) == 0
    assert isinstance(reads.copy_parts_hashed([out], segment, (40 << 20) - 10, True), TransferError)


def test_large_same_host_reads_on_several_threads_are_exact(pool: Cluster) -> None:
    """A batched get of 1 MiB objects and a single 16 MiB get, copied on two lanes
    (ClientConfig.copy_threads) out of a same-host node: exact bytes, every one checked;
    a corrupted replica is still caught on the lanes path."""
    import numpy as np

    rng = np.random.default_rng(3)
    values = {f"lane-{i}": rng.integers(0, 256, 1 << 20, np.uint8).tobytes() for i in range(6)}
    values["lane-big"] = rng.integers(0, 256, 16 << 20, np.uint8).tobytes()
    with Client(pool.address, copy_threads=2) as c:
        assert c._ctx.config.copy_lanes == 2
        for key, value in values.items():
            c.put(key, value)
        small = [k for k in values if k != "lane-big"]
        buf = np.zeros(len(small) << 20, np.uint8)
        outs = [buf[i << 20 : (i + 1) << 20] for i in range(len(small))]
        for _ in range(2):  # looked up, then from the location cache
            assert c.batch_get_into(small, outs) == [1 << 20] * len(small)
            assert all(o.tobytes() == values[k] for k, o in zip(small, outs, strict=True))
            big = bytearray(16 << 20)
            assert c.get_into("lane-big", big) == 16 << 20 and big == values["lane-big"]
        overwrite_cached(c, "lane-big", b"\xff" * 4096, at=9 << 20)
        with pytest.raises(CorruptError):
            c.get_into("lane-big", big)
        for key in values:
            c.remove(key, force=True)


def test_threads_share_one_extent_and_release_each_only_when_idle(pool: Cluster) -> None:
    """Eight threads putting through one client: one grant in flight at a time (a put
    that finds the extent full meanwhile goes through PutStart), an extent replaced
    while puts are still writing into it is released by the last of them, never with
    the grant: every object is there afterwards and at most the current extent and the
    next one are left on the master (before, racing grants orphaned extents, whose
    leases filled the segment, and a release freed ranges a write was still landing in)."""
    import time

    from kvstore.client.extents import ExtentHolder
    from kvstore.v1 import common_pb2, master_pb2

    h = ExtentHolder(1 << 20, 1 << 20, 0.0)
    reply = master_pb2.GrantExtentResponse(extent_id=7, ttl_ms=60_000, alignment=64)
    reply.location.CopyFrom(common_pb2.Location(node_id="n", segment="s", offset=0, length=1 << 20))
    assert h.begin_grant() == 0 and h.begin_grant() is None  # one grant at a time
    h.install(reply, time.monotonic())
    taken = h.take([1000])
    assert taken is not None and taken[0] == 7 and not taken[2]  # plenty left: no ask
    assert h.begin_grant() == 0  # a put is still writing into 7: not released with the grant
    assert h.done(7) is True  # ...but by that put, the last one in it
    h.end_grant()
    h.install(reply, time.monotonic())
    assert h.take([10]) is not None
    h.abandon(7)  # a write of unknown fate: never released
    assert h.done(7) is False and h.current() == 0

    value = b"x" * (512 << 10)  # 8 x 4 of them: half the node (eviction would not keep all)
    with Client(pool.address, timeout_s=TIMEOUT_S, extent_bytes=2 << 20) as c:

        def put(t: int) -> None:
            for i in range(4):
                c.put(f"share-{t}-{i}", value)

        assert in_threads(put, 8) == []
        keys = [f"share-{t}-{i}" for t in range(8) for i in range(4)]
        assert all(c.get(k) == value for k in keys)
        holder = c._ctx.extents
        assert holder.grants + holder.ahead >= 2 and pool.stats().extents <= 2
        for k in keys:
            assert c.remove(k)
    assert pool.stats().extents == 0  # the close released them all


def _grant_reply(extent_id: int, offset: int, length: int) -> object:
    from kvstore.v1 import common_pb2, master_pb2

    reply = master_pb2.GrantExtentResponse(extent_id=extent_id, ttl_ms=60_000, alignment=64)
    reply.location.CopyFrom(
        common_pb2.Location(node_id="n", segment="s", offset=offset, length=length)
    )
    return reply


def test_the_holder_asks_for_the_next_extent_once_and_moves_on_to_it() -> None:
    """ExtentHolder alone: a put that leaves under a quarter of the extent asks (one ask
    at a time); the next extent a commit brings takes the put that no longer fits, and
    the extent left idle is released with the next commit; the last put in a replaced
    extent releases it; a next extent the put does not fit is released, never lost."""
    import time

    from kvstore.client.extents import ExtentHolder
    from kvstore.v1 import master_pb2

    h = ExtentHolder(4096, 4096, 0.0)
    h.begin_grant()
    h.install(_grant_reply(1, 0, 4096), time.monotonic())  # type: ignore[arg-type]
    asks = [h.take_one(1024)[2] for _ in range(3)]  # type: ignore[index]
    assert asks == [0, 0, 1]  # 1024 left < 2 x 1024: ask (number 1)
    assert h.take_one(512)[2] == 0  # type: ignore[index]  # one ask at a time
    for _ in range(4):
        h.done(1)
    commit = master_pb2.CommitExtentResponse()
    commit.next.CopyFrom(_grant_reply(2, 8192, 4096))  # type: ignore[arg-type]
    h.answered(1, commit, time.monotonic())
    assert h.ahead == 1 and h.current() == 1
    taken = h.take_one(1024)  # 512 left in 1: it moves on to 2
    assert taken is not None and taken[0] == 2 and taken[1].offset == 8192
    assert h.current() == 2 and h.take_released() == [1] and h.take_released() == []
    h.done(2)
    # a replaced extent with a put still in it: released by that put, not by a commit
    h.answered(0, _with_next(3, 16384), time.monotonic())  # type: ignore[arg-type]
    busy = h.take_one(3000)  # in 2, and 2 keeps it busy
    assert busy is not None and busy[0] == 2
    moved = h.take_one(1024)  # 2 is full: on to 3
    assert moved is not None and moved[0] == 3 and h.take_released() == []
    assert h.done(2) is True  # the last put in 2: the caller releases it
    h.done(3)
    # a next extent too small for the put: a GrantExtent, and the next one is released
    h.answered(0, _with_next(4, 32768, 256), time.monotonic())  # type: ignore[arg-type]
    assert h.take_one(4000) is None
    assert h.begin_grant() == 3 and h.take_released() == [4]
    h.end_grant()
    assert h.detach() == [] and h.current() == 0


def test_an_ask_no_commit_carried_ends_with_its_put() -> None:
    """A put whose commit was to ask for the next extent but never went out (its write
    failed, it fell back to PutStart) ends its ask with `done`: the next put asks
    again. An ask that a commit answered is not ended twice: a later put's ask stands."""
    import time

    from kvstore.client.extents import ExtentHolder

    h = ExtentHolder(4096, 4096, 0.0)
    h.begin_grant()
    h.install(_grant_reply(1, 0, 4096), time.monotonic())  # type: ignore[arg-type]
    assert [h.take_one(1024)[2] for _ in range(3)] == [0, 0, 1]  # type: ignore[index]
    assert h.take_one(256)[2] == 0  # type: ignore[index]  # ask 1 is out
    h.done(1, 1)  # its put failed before any commit: the ask ends with it
    second = h.take_one(256)
    assert second is not None and second[2] == 2  # so the next put asks
    h.answered(2, None, time.monotonic())  # ask 2's commit failed: no next extent
    third = h.take_one(64)
    assert third is not None and third[2] == 3
    h.done(1, 2)  # ask 2 already ended: ask 3 still stands
    assert h.take_one(64)[2] == 0  # type: ignore[index]
    h.answered(3, None, time.monotonic())
    assert h.take_one(64)[2] == 4  # type: ignore[index]


def _with_next(extent_id: int, offset: int, length: int = 4096) -> object:
    from kvstore.v1 import master_pb2

    commit = master_pb2.CommitExtentResponse()
    commit.next.CopyFrom(_grant_reply(extent_id, offset, length))  # type: ignore[arg-type]
    return commit


def test_a_stream_of_puts_waits_on_no_grant_after_the_first(pool: Cluster) -> None:
    """Through a real master: after the first put's GrantExtent, every extent comes with
    a commit, no put sends a GrantExtent, the extents moved on from are released (the
    master holds at most the current and the next), every object reads back, and the
    close releases what is left."""
    value = bytes(range(256)) * 1024  # 256 KiB: 4 per 1 MiB extent
    with Client(pool.address, timeout_s=TIMEOUT_S, extent_bytes=1 << 20) as c:
        calls: list[str] = []
        route = c._route
        c._route = lambda step: calls.append(step.method) or route(step)  # type: ignore[method-assign]
        for i in range(24):
            c.put(f"ahead-{i}", value)
            assert pool.stats().extents <= 2
        holder = c._ctx.extents
        assert calls.count("GrantExtent") == 1 and holder.grants == 1
        assert holder.ahead >= 5 and holder.fallbacks == 0
        assert calls.count("CommitExtent") == 24 and calls.count("PutStart") == 0
        assert all(c.get(f"ahead-{i}") == value for i in range(24))
        stats = pool.stats()
        assert stats.complete == 24 and stats.writing == 0
        assert stats.extent_bytes <= 2 << 20  # nothing held but the current and the next
    after = pool.wait_stats(lambda s: s.extents == 0, timeout_s=10)
    assert after.extent_bytes == 0 and allocated(pool) == 24 * len(value)
    with Client(pool.address) as c:
        for i in range(24):
            assert c.remove(f"ahead-{i}")


def test_a_bad_next_extent_ask_refuses_the_commit_and_no_room_keeps_it(pool: Cluster) -> None:
    """CommitExtent's next_size is checked before anything is committed (a size over
    the master's max_extent_bytes: INVALID_ARGUMENT, the key not visible); when the
    master has no room for the next extent, the commit stands and none is granted."""
    from kvstore.errors import BadRequestError
    from kvstore.fastlane import SyncLane
    from kvstore.v1 import master_pb2

    with Client(pool.address, timeout_s=TIMEOUT_S) as c:
        c.put("seed", b"s" * 1000)  # a grant: this client holds an extent
        holder = c._ctx.extents
        lease = holder._lease
        assert lease is not None
        lane_addr = pool.stats().fast_lane
        lane = SyncLane(lane_addr, timeout_s=5.0)
        try:
            request = master_pb2.CommitExtentRequest(
                client_id=c.config.id, extent_id=lease.extent_id, next_size=1 << 40,
                next_min_size=1,
            )  # fmt: skip
            free = -(-lease.cursor // lease.alignment) * lease.alignment
            request.items.add(key="nope", offset=free, size=100)
            with pytest.raises(BadRequestError):
                lane.call("CommitExtent", request)
            assert not c.exists("nope")
            request.next_size = request.next_min_size = 32 << 20  # more than is free
            reply = lane.call("CommitExtent", request)
            assert [r.code for r in reply.results] == [0], reply.results
            assert not reply.HasField("next")
            assert c.exists("nope")
        finally:
            lane.close()
        assert c.remove("nope") and c.remove("seed")
