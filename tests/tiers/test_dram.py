"""DramTier: eviction order, protections, two-phase writes, batches, threads."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest

from kvstore.errors import BadRequestError, ExistsError, NoSpaceError, NotReadyError, TooLargeError
from kvstore.tiers.base import ObjectTier
from kvstore.tiers.dram import DramTier
from kvstore.types import Tier
from tests.tiers.dram_util import BLOCK, FakeClock, make_tier, small_tier, val


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def tier(clock: FakeClock) -> Iterator[DramTier]:
    yield from small_tier(clock)


@pytest.fixture
def evicted(tier: DramTier) -> list[tuple[str, bytes]]:
    log: list[tuple[str, bytes]] = []
    tier.set_evict_callback(lambda key, view: log.append((key, bytes(view))))
    return log


def test_implements_the_tier_protocol(tier: DramTier) -> None:
    assert isinstance(tier, ObjectTier)
    assert tier.tier is Tier.DRAM


def test_put_get_roundtrip_and_stats(tier: DramTier) -> None:
    tier.put("a", b"hello")
    tier.put("b", bytearray(b"x" * 100))
    assert tier.get("a") == b"hello"
    assert tier.get("zz") is None
    assert tier.size_of("b") == 100 and tier.size_of("zz") is None
    assert tier.exists("a") and not tier.exists("zz")
    stats = tier.stats()
    assert (stats.used, stats.objects, stats.hits, stats.misses) == (192, 2, 1, 1)
    assert (stats.bytes_written, stats.bytes_read) == (105, 5)
    assert stats.extra["largest_free"] == 64 and stats.extra["fragmentation"] == 0.0


def test_lru_eviction_order(tier: DramTier, evicted: list[tuple[str, bytes]]) -> None:
    for key in "abcd":
        tier.put(key, val(key))
    assert tier.get("a") == val("a")
    tier.put("e", val("e"))
    tier.put("f", val("f"))
    assert [k for k, _ in evicted] == ["b", "c"]
    assert evicted[0][1] == val("b")  # the callback saw the bytes before they were freed
    assert tier.keys() == ["d", "a", "e", "f"]
    tier.get("d")  # slots hold a e f d; LRU is now a e f d
    tier.put("g", val("g", 2 * BLOCK))  # needs two adjacent slots: a and e
    assert [k for k, _ in evicted] == ["b", "c", "a", "e"]
    assert tier.keys() == ["f", "d", "g"]
    assert tier.stats().evictions == 4


def test_eviction_down_to_low_watermark(clock: FakeClock) -> None:
    log: list[str] = []
    with make_tier(10, clock, high=0.8, low=0.5) as t:
        t.set_evict_callback(lambda key, _: log.append(key))
        for key in "abcdefgh":  # 8 of 10 slots: at the high watermark
            t.put(key, val(key))
        assert log == []
        t.get("a")
        t.put("i", val("i"))  # 9 > 8: evict until 9th fits within 5 slots
        assert log == ["b", "c", "d", "e"]
        assert t.keys() == ["f", "g", "h", "a", "i"]
        assert t.stats().used == 5 * BLOCK
        t.check_integrity()


def test_evicts_oldest_adjacent_pair_for_a_large_object(clock: FakeClock) -> None:
    with make_tier(4, clock) as t:
        for key in "abcd":
            t.put(key, val(key))
        t.get("b")  # LRU: a c d b; a and c are not adjacent, so d follows
        log: list[str] = []
        t.set_evict_callback(lambda key, _: log.append(key))
        t.put("big", val("x", 2 * BLOCK))
        assert log == ["a", "c", "d"]
        assert t.keys() == ["b", "big"]
        t.check_integrity()


def test_pinned_leased_and_read_objects_are_never_evicted(
    tier: DramTier, clock: FakeClock, evicted: list[tuple[str, bytes]]
) -> None:
    for key in "abcd":
        tier.put(key, val(key))
    assert tier.pin("a") and tier.lease("b", 10.0)
    handle = tier.acquire("c")  # LRU: a b d c
    assert handle is not None
    tier.put("e", val("e"))
    assert [k for k, _ in evicted] == ["d"]
    tier.pin("e")
    with pytest.raises(NoSpaceError):
        tier.put("f", val("f"))
    assert tier.keys() == ["a", "b", "c", "e"]
    tier.check_integrity()
    handle.release()
    tier.put("f", val("f"))  # c is evictable again
    assert [k for k, _ in evicted] == ["d", "c"]
    clock.now += 10.0  # lease over: b goes next
    tier.put("g", val("g"))
    assert [k for k, _ in evicted] == ["d", "c", "b"]
    assert tier.unpin("a") and not tier.unpin("a")
    tier.put("h", val("h"))
    assert [k for k, _ in evicted] == ["d", "c", "b", "a"]
    assert tier.keys() == ["e", "f", "g", "h"]


def test_no_space_changes_nothing(tier: DramTier, evicted: list[tuple[str, bytes]]) -> None:
    for key in "abcd":
        tier.put(key, val(key))
    tier.pin("b")
    tier.pin("c")
    before = (tier.keys(), tier.stats().used)
    with pytest.raises(NoSpaceError):  # a+d free two slots, but not adjacent ones
        tier.put("big", val("x", 2 * BLOCK))
    assert evicted == []
    assert (tier.keys(), tier.stats().used) == before
    assert not tier.exists("big")


def test_two_phase_write_visibility(tier: DramTier) -> None:
    handle = tier.reserve("k", 5)
    assert not tier.exists("k") and tier.size_of("k") is None and tier.keys() == []
    assert tier.batch_get(["k"]) == [None] and tier.batch_exists(["k"]) == [False]
    for read in (tier.get, tier.acquire, tier.locate, tier.remove):
        with pytest.raises(NotReadyError):
            read("k")
    with pytest.raises(NotReadyError):
        tier.get_into("k", bytearray(8))
    with pytest.raises(ExistsError):
        tier.reserve("k", 5)
    with pytest.raises(ExistsError):
        tier.put("k", b"other")
    handle.buffer[:] = b"12345"
    tier.commit(handle)
    assert tier.get("k") == b"12345"
    with pytest.raises(BadRequestError):
        tier.commit(handle)
    with pytest.raises(BadRequestError):
        tier.abort(handle)
    with pytest.raises(BadRequestError):
        _ = handle.buffer


def test_abort_frees_space(tier: DramTier) -> None:
    handle = tier.reserve("k", 4 * BLOCK)
    with pytest.raises(NoSpaceError):  # a WRITING object is never evicted
        tier.put("x", b"x")
    tier.abort(handle)
    assert tier.stats().used == 0 and not tier.exists("k")
    tier.put("k", val("k", 4 * BLOCK))
    assert tier.get("k") == val("k", 4 * BLOCK)


def test_reserved_object_can_be_pinned(tier: DramTier) -> None:
    handle = tier.reserve("k", 10)
    assert tier.pin("k")
    handle.buffer[:] = bytes(10)
    tier.commit(handle)
    for key in "abc":
        tier.put(key, val(key))
    tier.put("d", val("d"))  # evicts a, never the pinned k
    assert set(tier.keys()) == {"k", "b", "c", "d"}


def test_remove_with_reader_is_doomed(tier: DramTier) -> None:
    tier.put("a", val("a"))
    handle = tier.acquire("a")
    assert handle is not None
    assert tier.remove("a") and not tier.remove("a")
    assert not tier.exists("a") and tier.get("a") is None
    assert tier.stats().used == BLOCK and tier.stats().extra["doomed"] == 1
    tier.check_integrity()
    tier.put("a", b"new")  # the key is free again; the old bytes are still readable
    assert bytes(handle.buffer) == val("a")
    with handle:
        pass
    handle.release()  # idempotent
    assert tier.stats().used == BLOCK and tier.stats().extra["doomed"] == 0
    assert tier.get("a") == b"new"


def test_remove_under_lease_frees_after_expiry(tier: DramTier, clock: FakeClock) -> None:
    tier.put("a", val("a"))
    tier.lease("a", 5.0)
    location = tier.locate("a")
    assert location is not None
    assert tier.remove("a")
    assert tier.stats().used == BLOCK
    tier.put("b", val("b"))
    assert tier.stats().used == 2 * BLOCK  # still leased: not reaped
    clock.now += 5.0
    tier.put("c", val("c"))
    assert tier.stats().used == 2 * BLOCK and tier.stats().extra["doomed"] == 0


def test_read_handle_and_get_into(tier: DramTier) -> None:
    tier.put("a", b"abcdef")
    with tier.acquire("a") as handle:  # type: ignore[union-attr]
        assert bytes(handle.buffer) == b"abcdef" and handle.size == 6
        with pytest.raises(TypeError):
            handle.buffer[0:1] = b"z"
    out = bytearray(10)
    assert tier.get_into("a", memoryview(out)) == 6 and out[:6] == b"abcdef"
    assert tier.get_into("nope", out) is None
    arr = np.zeros(8, dtype=np.uint8)
    assert tier.get_into("a", arr) == 6 and bytes(arr[:6]) == b"abcdef"
    with pytest.raises(TooLargeError):
        tier.get_into("a", bytearray(5))
    with pytest.raises(BadRequestError):
        tier.get_into("a", b"read-only buffer")
    assert tier.acquire("nope") is None


def test_batches(tier: DramTier) -> None:
    ints = np.arange(4, dtype=np.int32)
    items = [("a", b"1"), ("b", b""), ("a", b"2"), (3, b"x"), "junk", ("c", ints)]
    results = tier.batch_put(items)  # type: ignore[arg-type]
    assert results[0] is None and results[5] is None
    assert [type(r).__name__ for r in results[1:5]] == [
        "BadRequestError",
        "ExistsError",
        "BadRequestError",
        "BadRequestError",
    ]
    assert tier.batch_get(["a", "zz", "c"]) == [b"1", None, ints.tobytes()]
    assert tier.batch_exists(["a", "zz", "c"]) == [True, False, True]
    with pytest.raises(BadRequestError):
        tier.batch_get(["a", 5])  # type: ignore[list-item]


def test_threads_put_and_get_concurrently(clock: FakeClock) -> None:
    with make_tier(64, clock, high=0.9, low=0.7) as t:
        errors: list[BaseException] = []
        start = threading.Barrier(4)

        def worker(n: int) -> None:
            try:
                start.wait(timeout=10)
                for i in range(300):
                    key = f"{n}-{i}"
                    t.put(key, val(key, 100))
                    got = t.get(key)
                    assert got is None or got == val(key, 100)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        assert errors == [] and not any(th.is_alive() for th in threads)
        t.check_integrity()
        assert t.stats().evictions == 1200 - t.stats().objects
