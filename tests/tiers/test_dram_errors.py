"""DramTier: bad input, config checks, close, shared-memory peers."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kvstore.errors import BadRequestError, TooLargeError
from kvstore.tiers.dram import DramConfig, DramTier
from tests.memfd import holders, shm_files
from tests.tiers.dram_util import BLOCK, FakeClock, make_tier, small_tier, val


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def tier(clock: FakeClock) -> Iterator[DramTier]:
    yield from small_tier(clock)


BAD_CALLS = [
    ("put", (5, b"x"), BadRequestError),
    ("put", (b"key", b"x"), BadRequestError),
    ("put", ("", b"x"), BadRequestError),
    ("put", ("k", b""), BadRequestError),
    ("put", ("k", "text"), BadRequestError),
    ("put", ("k", 42), BadRequestError),
    ("put", ("k", bytes(4 * BLOCK + 1)), TooLargeError),
    ("reserve", ("k", 0), BadRequestError),
    ("reserve", ("k", -1), BadRequestError),
    ("reserve", ("k", 1.5), BadRequestError),
    ("reserve", ("k", True), BadRequestError),
    ("reserve", ("k", 4 * BLOCK + 1), TooLargeError),
    ("reserve", (None, 8), BadRequestError),
    ("get", (7,), BadRequestError),
    ("exists", (None,), BadRequestError),
    ("remove", (1.0,), BadRequestError),
    ("pin", (b"a",), BadRequestError),
    ("lease", ("a", 0), BadRequestError),
    ("lease", ("a", float("inf")), BadRequestError),
    ("lease", ("a", "5"), BadRequestError),
    ("commit", ("not a handle",), BadRequestError),
    ("get_into", ("a", 12), BadRequestError),
]


@pytest.mark.parametrize(("method", "args", "error"), BAD_CALLS)
def test_bad_input_is_typed_and_harmless(
    tier: DramTier, method: str, args: tuple[object, ...], error: type[Exception]
) -> None:
    tier.put("a", b"abc")
    before = (tier.keys(), tier.stats().used)
    with pytest.raises(error):
        getattr(tier, method)(*args)
    tier.check_integrity()
    assert (tier.keys(), tier.stats().used) == before
    assert tier.get("a") == b"abc"


def test_handle_of_another_tier_is_rejected(tier: DramTier, clock: FakeClock) -> None:
    with make_tier(4, clock) as other:
        handle = other.reserve("k", 4)
        with pytest.raises(BadRequestError):
            tier.commit(handle)
        other.abort(handle)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"capacity_bytes": 0},
        {"capacity_bytes": 100},
        {"capacity_bytes": 640, "alignment": 3},
        {"capacity_bytes": 640, "high_watermark": 0.5, "low_watermark": 0.6},
        {"capacity_bytes": 640, "low_watermark": 0.0},
        {"capacity_bytes": 640, "high_watermark": 1.5},
        {"capacity_bytes": 640, "segment_name": "a/b"},
    ],
)
def test_bad_config(kwargs: dict[str, object]) -> None:
    with pytest.raises(BadRequestError):
        DramConfig(**kwargs)  # type: ignore[arg-type]


def test_evict_callback_error_still_evicts(tier: DramTier) -> None:
    def boom(key: str, view: memoryview) -> None:
        raise RuntimeError("demotion failed")

    tier.set_evict_callback(boom)
    for key in "abcde":
        tier.put(key, val(key))
    assert tier.keys() == ["b", "c", "d", "e"]
    assert tier.stats().extra["evict_callback_errors"] == 1


def test_close_frees_segment_and_rejects_use(clock: FakeClock) -> None:
    t = make_tier(4, clock)
    t.put("a", b"x")
    handle = t.reserve("b", 3)
    reader = t.acquire("a")
    label = t.segment.name
    assert holders(label) == [os.getpid()] and shm_files(label) == []  # anonymous
    t.close()
    t.close()
    with pytest.raises(BadRequestError):
        t.put("c", b"y")
    with pytest.raises(BadRequestError):
        t.commit(handle)
    reader.release()  # type: ignore[union-attr]
    t.check_integrity()
    del handle, reader  # the last views into the segment: then the kernel frees it
    gc.collect()
    assert holders(label) == []


PEER = """
import sys
from kvstore.tiers.shm import SharedSegment
name, address, offset, length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with SharedSegment.attach(name, address) as seg:
    sys.stdout.write(bytes(seg.buffer[offset:offset + length]).hex())
"""


def test_peer_process_reads_located_object(clock: FakeClock) -> None:
    with make_tier(64, clock) as t:
        t.put("pad", bytes(100))
        payload = os.urandom(1000)
        t.put("obj", payload)
        assert t.lease("obj", 30.0)
        location = t.locate("obj")
        assert location is not None
        name, offset, length = location
        assert (name, offset, length) == (t.segment.name, 128, 1000)
        address = t.segment.serve()
        proc = subprocess.run(
            [sys.executable, "-c", PEER, name, address, str(offset), str(length)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert bytes.fromhex(proc.stdout) == payload
        assert t.locate("missing") is None


def test_dropped_tier_frees_its_segment(clock: FakeClock) -> None:
    t = make_tier(4, clock)
    label = t.segment.name
    t.segment.serve()
    assert holders(label) == [os.getpid()]
    del t
    gc.collect()
    assert holders(label) == []  # neither the mapping nor the served fd is left


def test_evict_callback_view_dies_after_the_call(tier: DramTier) -> None:
    kept: list[memoryview] = []
    tier.set_evict_callback(lambda key, view: kept.append(view))
    for key in "abcde":
        tier.put(key, val(key))
    assert len(kept) == 1
    with pytest.raises(ValueError, match="released"):
        bytes(kept[0])
