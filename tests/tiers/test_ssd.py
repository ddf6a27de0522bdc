"""SSD tier: real files on the real disk (O_DIRECT), ramfs (buffered fallback), tmpfs."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.errors import (
    BadRequestError,
    CorruptError,
    ExistsError,
    NoSpaceError,
    NotReadyError,
    TooLargeError,
    UnavailableError,
)
from kvstore.tiers.base import ObjectTier
from kvstore.tiers.ssd import SsdConfig, SsdTier
from kvstore.types import ObjectKey, Tier

KiB, MiB = 1024, 1 << 20
ROOT = Path(__file__).resolve().parents[2]


def K(name: str) -> ObjectKey:
    return ObjectKey(name)


def blob(n: int, seed: int = 0) -> bytes:
    """n pseudo-random bytes, the same for the same (n, seed)."""
    return random.Random(n * 1_000_003 + seed).randbytes(n)


def open_tier(directory: Path | str, capacity: int = 64 * MiB, **kw: object) -> SsdTier:
    return SsdTier(SsdConfig(str(directory), capacity, **kw))  # type: ignore[arg-type]


@contextlib.contextmanager
def mounted(fstype: str, options: str = "") -> Iterator[Path]:
    """A fresh mount of `fstype`, or skip the test where mounting is not allowed."""
    where = Path(tempfile.mkdtemp(prefix=f"ssd-{fstype}-"))
    cmd = ["mount", "-t", fstype, *(["-o", options] if options else []), fstype, str(where)]
    if os.geteuid() != 0 or subprocess.run(cmd, capture_output=True).returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount {fstype} here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=True)
        where.rmdir()


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[SsdTier]:
    t = open_tier(tmp_path / "ssd")
    yield t
    t.close()


def test_config_is_validated(tmp_path: Path) -> None:
    good = str(tmp_path)
    for bad in [
        dict(capacity_bytes=0),
        dict(capacity_bytes=4097),
        dict(capacity_bytes=8192, alignment=1000),
        dict(capacity_bytes=8192, alignment=256),
        dict(capacity_bytes=8192, io_threads=0),
        dict(capacity_bytes=True),
    ]:
        with pytest.raises(BadRequestError):
            SsdConfig(good, **bad)  # type: ignore[arg-type]
    with pytest.raises(BadRequestError):
        SsdConfig("", 8192)


def test_implements_object_tier(tier: SsdTier) -> None:
    assert isinstance(tier, ObjectTier)
    assert tier.tier is Tier.SSD


SIZES = [1, 511, 4095, 4096, 4097, MiB - 1, MiB, MiB + 1, 3 * MiB + 777, 16 * MiB + 5]


def test_round_trip_direct_io_and_reopen(tmp_path: Path) -> None:
    t = open_tier(tmp_path / "ssd")
    assert t.io_mode == "direct" and t.stats().extra["direct_io"] == 1.0
    values = {K(f"k{n}"): blob(n, n) for n in SIZES}
    for key, value in values.items():
        t.put(key, value)
    for key, value in values.items():
        assert t.get(key) == value
        assert t.size_of(key) == len(value)
    out = bytearray(16 * MiB + 5)
    assert t.get_into(K("k4097"), memoryview(out)) == 4097
    assert out[:4097] == values[K("k4097")]
    s = t.stats()
    assert (s.objects, s.bytes_written) == (len(SIZES), sum(SIZES))
    assert s.used == sum((n + 4095) // 4096 * 4096 for n in SIZES)
    t.check_integrity()
    t.close()
    t = open_tier(tmp_path / "ssd")
    assert t.keys() == list(values)  # LRU order (commit order) survives the restart
    assert all(t.get(k) == v for k, v in values.items())
    assert t.stats().extra["recovered"] == len(SIZES)
    t.check_integrity()
    t.close()


def test_buffered_fallback_on_ramfs() -> None:
    with mounted("ramfs") as where:
        t = open_tier(where / "ssd", 8 * MiB)
        assert t.io_mode == "buffered" and t.stats().extra["direct_io"] == 0.0
        values = {K(f"k{n}"): blob(n, n) for n in [1, 4097, 2 * MiB + 3]}
        for key, value in values.items():
            t.put(key, value)
        t.check_integrity()
        t.close()
        t = open_tier(where / "ssd", 8 * MiB)
        assert all(t.get(k) == v for k, v in values.items())
        t.check_integrity()
        t.close()


def test_buffered_when_asked_and_on_dev_shm(tmp_path: Path) -> None:
    shm = Path(tempfile.mkdtemp(prefix="ssd-test-", dir="/dev/shm"))
    try:
        for where, direct in [(tmp_path / "ssd", False), (shm, True)]:
            t = open_tier(where, 8 * MiB, direct_io=direct)
            if not direct:
                assert t.io_mode == "buffered"
            t.put(K("a"), blob(5 * MiB + 1))
            assert t.get(K("a")) == blob(5 * MiB + 1)
            t.check_integrity()
            t.close()
    finally:
        shutil.rmtree(shm)


def test_reserve_commit_abort(tier: SsdTier) -> None:
    handle = tier.reserve(K("w"), 10_000)
    assert len(handle.buffer) == 10_000
    assert not tier.exists(K("w")) and tier.keys() == []
    with pytest.raises(NotReadyError):
        tier.get(K("w"))
    with pytest.raises(NotReadyError):
        tier.remove(K("w"))
    with pytest.raises(ExistsError):
        tier.put(K("w"), b"x")
    assert tier.batch_get([K("w")]) == [None]
    tier.check_integrity()
    handle.buffer[:] = blob(10_000, 3)
    tier.commit(handle)
    assert tier.get(K("w")) == blob(10_000, 3)
    with pytest.raises(BadRequestError):
        tier.commit(handle)
    with pytest.raises(ExistsError):
        tier.put(K("w"), b"again")
    used = tier.stats().used
    gone = tier.reserve(K("gone"), 5 * MiB)
    assert tier.stats().used == used + 5 * MiB
    tier.abort(gone)
    assert tier.stats().used == used and not tier.exists(K("gone"))
    with pytest.raises(BadRequestError):
        tier.abort(gone)
    tier.check_integrity()


def test_lru_eviction_order_pins_and_readers(tmp_path: Path) -> None:
    t = open_tier(tmp_path / "ssd", 4 * 64 * KiB)
    evicted: list[tuple[str, bytes]] = []
    t.set_evict_callback(lambda key, view: evicted.append((key, bytes(view))))
    for name in "abcd":
        t.put(K(name), blob(64 * KiB, ord(name)))
    assert t.get(K("a")) == blob(64 * KiB, ord("a"))  # a becomes most recent
    assert t.pin(K("b"))
    t.put(K("e"), blob(64 * KiB, 1))  # b pinned: c goes
    assert evicted == [("c", blob(64 * KiB, ord("c")))]
    held = t.acquire(K("d"))  # d being read (and now most recent)
    assert held is not None
    t.put(K("f"), blob(64 * KiB, 2))
    assert [k for k, _ in evicted] == ["c", "a"]
    assert t.keys() == ["b", "e", "d", "f"]
    held.release()
    assert t.unpin(K("b")) and not t.unpin(K("b"))
    t.set_evict_callback(None)
    t.put(K("g"), blob(128 * KiB, 3))  # b's range alone is too small: b, then e
    assert t.keys() == ["d", "f", "g"]
    assert t.stats().evictions == 4 and len(evicted) == 2
    assert all(t.pin(K(k)) for k in "dfg")
    with pytest.raises(NoSpaceError):
        t.put(K("h"), blob(4096))
    assert t.get(K("d")) == blob(64 * KiB, ord("d")) and not t.exists(K("h"))
    t.check_integrity()
    t.close()


def test_freed_space_is_reused(tmp_path: Path) -> None:
    t = open_tier(tmp_path / "ssd", MiB)
    for i in range(300):
        t.put(K(f"k{i}"), blob(100_000 + i * 37, i))
        if i >= 5:
            assert t.remove(K(f"k{i - 5}"))
        assert t.stats().used <= 6 * 112 * KiB
    assert t.stats().evictions == 0
    assert t.keys() == [f"k{i}" for i in range(295, 300)]
    assert t.get(K("k297")) == blob(100_000 + 297 * 37, 297)
    for i in range(295, 300):
        assert t.remove(K(f"k{i}"))
    assert t.stats().used == 0 and not t.remove(K("k1"))
    t.put(K("whole"), blob(MiB, 9))  # all space coalesced back into one range
    t.check_integrity()
    t.close()


def flip_byte(slab: Path, offset: int) -> None:
    with open(slab, "r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ 0xFF]))


def test_corrupt_byte_raises_and_is_dropped(tmp_path: Path) -> None:
    t = open_tier(tmp_path / "ssd", 8 * MiB)
    t.put(K("a"), blob(10_000, 1))
    t.put(K("b"), blob(10_000, 2))
    flip_byte(tmp_path / "ssd" / "slab.dat", 4096 * 3 + 17)  # inside b (a takes 3 pages)
    with pytest.raises(CorruptError):
        t.get(K("b"))
    assert not t.exists(K("b")) and t.get(K("a")) == blob(10_000, 1)
    assert t.stats().extra["dropped_corrupt"] == 1
    t.check_integrity()
    t.put(K("c"), blob(20_000, 3))
    t.close()
    flip_byte(tmp_path / "ssd" / "slab.dat", 5)  # inside a, while closed
    t = open_tier(tmp_path / "ssd", 8 * MiB)
    assert t.keys() == ["c"] and t.stats().extra["dropped_corrupt"] == 1
    assert t.get(K("c")) == blob(20_000, 3)
    t.check_integrity()
    t.close()


def test_bad_inputs_give_typed_errors_and_keep_the_store(tier: SsdTier) -> None:
    tier.put(K("keep"), blob(5000, 5))
    bad_calls = [
        (TooLargeError, lambda: tier.put(K("big"), bytes(64 * MiB + 1))),
        (TooLargeError, lambda: tier.reserve(K("big"), 65 * MiB)),
        (BadRequestError, lambda: tier.put(K("empty"), b"")),
        (BadRequestError, lambda: tier.reserve(K("empty"), 0)),
        (BadRequestError, lambda: tier.reserve(K("neg"), -1)),
        (BadRequestError, lambda: tier.reserve(K("float"), 1.5)),
        (BadRequestError, lambda: tier.put(K("text"), "not bytes")),
        (BadRequestError, lambda: tier.put(42, b"x")),
        (BadRequestError, lambda: tier.put(b"bytes-key", b"x")),
        (BadRequestError, lambda: tier.put("", b"x")),
        (BadRequestError, lambda: tier.get(None)),
        (BadRequestError, lambda: tier.remove(3.0)),
        (BadRequestError, lambda: tier.batch_get([K("keep"), 7])),
        (BadRequestError, lambda: tier.commit(object())),
        (TooLargeError, lambda: tier.get_into(K("keep"), memoryview(bytearray(10)))),
        (BadRequestError, lambda: tier.get_into(K("keep"), memoryview(b"read-only"))),
    ]
    for error, call in bad_calls:
        with pytest.raises(error):
            call()  # type: ignore[no-untyped-call]
        tier.check_integrity()
    assert tier.keys() == ["keep"] and tier.get(K("keep")) == blob(5000, 5)
    assert tier.stats().used == 8192


def test_batches_return_a_result_per_key(tier: SsdTier) -> None:
    tier.put(K("pre"), b"pre")
    items = [(K(f"b{i}"), blob(MiB + i, i)) for i in range(6)]
    results = tier.batch_put([*items, (K("zero"), b""), (K("pre"), b"dup"), K("lonely")])
    assert results[:6] == [None] * 6
    assert isinstance(results[6], BadRequestError) and isinstance(results[7], ExistsError)
    assert isinstance(results[8], BadRequestError)
    got = tier.batch_get([K("b3"), K("nope"), K("b5")])
    assert got == [items[3][1], None, items[5][1]]
    assert tier.batch_exists([K("b1"), K("zero"), K("pre")]) == [True, False, True]
    s = tier.stats()
    assert (s.hits, s.misses) == (2, 1)
    tier.check_integrity()


def test_remove_while_read_frees_at_release(tier: SsdTier) -> None:
    tier.put(K("r"), blob(3 * MiB, 4))
    handle = tier.acquire(K("r"))
    assert handle is not None and tier.acquire(K("missing")) is None
    assert tier.remove(K("r")) and not tier.exists(K("r"))
    assert tier.stats().used == 3 * MiB and tier.stats().extra["doomed"] == 1
    tier.check_integrity()
    assert bytes(handle.buffer) == blob(3 * MiB, 4)
    handle.release()
    handle.release()
    assert tier.stats().used == 0
    tier.check_integrity()


def test_closed_tier_refuses(tmp_path: Path) -> None:
    t = open_tier(tmp_path / "ssd", MiB)
    t.close()
    with pytest.raises(UnavailableError):
        t.put(K("x"), b"x")
    with pytest.raises(UnavailableError):
        t.get(K("x"))


def test_threads_writing_reading_and_evicting_keep_the_store_consistent(tmp_path: Path) -> None:
    t = open_tier(tmp_path / "ssd", 4 * MiB)  # small: puts evict while others read
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            for i in range(40):
                key = K(f"w{w}-{i}")
                t.put(key, blob(100_000 + w, i))
                got = t.get(key)  # None only if another thread's put evicted it
                assert got is None or got == blob(100_000 + w, i)
                if i % 3 == 0:
                    t.remove(key)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors and not any(th.is_alive() for th in threads)
    t.check_integrity()
    for key in t.keys():
        w, i = (int(x) for x in key[1:].split("-"))
        assert t.get(key) == blob(100_000 + w, i)
    t.close()
