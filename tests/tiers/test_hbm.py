"""HBM tier: ObjectTier semantics, exact LRU eviction order, evict-callback bytes."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from kvstore.errors import (
    BadRequestError,
    ExistsError,
    NoSpaceError,
    NotReadyError,
    TooLargeError,
    UnavailableError,
)
from kvstore.tiers.base import ObjectTier
from kvstore.tiers.hbm import HbmConfig, HbmTier, KVLayout
from kvstore.types import Tier

SMALL = KVLayout(num_layers=2, block_tokens=4, kv_heads=2, head_dim=8)  # 512-byte blocks


def value(i: int, size: int = SMALL.block_bytes) -> bytes:
    return random.Random(i).randbytes(size)


def make_tier(num_blocks: int = 4) -> HbmTier:
    return HbmTier(HbmConfig(SMALL, num_blocks, device="cpu"))


# -- tier ------------------------------------------------------------------------


def test_tier_put_get_and_device_layout() -> None:
    tier = make_tier()
    assert isinstance(tier, ObjectTier) and tier.tier is Tier.HBM
    tier.put("a", value(1))
    assert tier.get("a") == value(1)
    assert tier.get("zz") is None
    assert (tier.exists("a"), tier.size_of("a"), tier.size_of("zz")) == (True, 512, None)
    block = tier.block_id_of("a")
    assert block is not None and tier.block_id_of("zz") is None
    per_layer = SMALL.block_bytes_per_layer
    for n, layer in enumerate(tier.kv.layers):  # block-major bytes -> per-layer tensors
        got = layer[block].contiguous().view(torch.uint8).numpy().tobytes()
        assert got == value(1)[n * per_layer : (n + 1) * per_layer]
    s = tier.stats()
    assert (s.objects, s.used, s.capacity, s.hits, s.misses) == (1, 512, 2048, 1, 1)
    assert (s.bytes_written, s.bytes_read) == (512, 512)
    tier.check_integrity()


def test_tier_rejects_bad_input_and_stays_consistent() -> None:
    tier = make_tier()
    tier.put("a", value(1))
    cases = [
        (BadRequestError, lambda: tier.put("b", value(2, 511))),
        (TooLargeError, lambda: tier.put("b", value(2, 513))),
        (TooLargeError, lambda: tier.reserve("b", 1024)),
        (BadRequestError, lambda: tier.reserve("b", 0)),
        (BadRequestError, lambda: tier.put(7, value(2))),  # type: ignore[arg-type]
        (BadRequestError, lambda: tier.put("", value(2))),
        (BadRequestError, lambda: tier.put("b", 12345)),  # type: ignore[arg-type]
        (BadRequestError, lambda: tier.get(b"a")),  # type: ignore[arg-type]
        (BadRequestError, lambda: tier.batch_get(["a", None])),  # type: ignore[list-item]
        (ExistsError, lambda: tier.put("a", value(3))),
        (TooLargeError, lambda: tier.get_into("a", memoryview(bytearray(100)))),
        (BadRequestError, lambda: tier.get_into("a", memoryview(bytes(512)))),
    ]
    for error, call in cases:
        with pytest.raises(error):
            call()
        tier.check_integrity()
    assert tier.get("a") == value(1) and tier.keys() == ["a"]
    assert tier.kv.pool.free_count == 3


def test_reserve_commit_abort() -> None:
    tier = make_tier()
    handle = tier.reserve("w", 512)
    assert handle.size == 512 and len(handle.buffer) == 512
    with pytest.raises(NotReadyError):
        tier.get("w")
    with pytest.raises(NotReadyError):
        tier.remove("w")
    with pytest.raises(ExistsError):
        tier.put("w", value(1))
    assert (tier.exists("w"), tier.batch_get(["w"]), tier.pin("w")) == (False, [None], False)
    assert tier.block_id_of("w") is None and tier.stats().extra["writing"] == 1
    tier.check_integrity()
    handle.buffer[:] = value(9)
    tier.commit(handle)
    assert tier.get("w") == value(9)
    with pytest.raises(BadRequestError):
        tier.commit(handle)
    with pytest.raises(BadRequestError):
        tier.abort(handle)
    aborted = tier.reserve("x", 512)
    assert tier.kv.pool.free_count == 2
    tier.abort(aborted)
    assert tier.exists("x") is False and tier.kv.pool.free_count == 3
    with pytest.raises(BadRequestError):
        make_tier().commit(tier.reserve("y", 512))  # a handle of another tier
    tier.check_integrity()


def test_lru_eviction_order_and_callback_bytes() -> None:
    tier = make_tier(4)
    evicted: list[tuple[str, bytes]] = []
    tier.set_evict_callback(lambda key, view: evicted.append((key, bytes(view))))
    for i, key in enumerate("abcd"):
        tier.put(key, value(i))
    assert tier.get("a") == value(0)  # a becomes most recent
    tier.put("e", value(4))
    tier.put("f", value(5))
    assert evicted == [("b", value(1)), ("c", value(2))]
    assert tier.keys() == ["d", "a", "e", "f"]
    assert tier.stats().evictions == 2 and tier.get("b") is None
    tier.check_integrity()


def test_eviction_skips_pinned_acquired_and_writing() -> None:
    tier = make_tier(4)
    evicted: list[str] = []
    tier.set_evict_callback(lambda key, view: evicted.append(key))
    for i, key in enumerate("abc"):
        tier.put(key, value(i))
    assert tier.pin("a") and not tier.pin("nope")
    held = tier.acquire("b")
    assert held is not None
    writing = tier.reserve("w", 512)
    tier.put("d", value(3))  # only c is evictable
    assert evicted == ["c"] and tier.pin("d")
    with pytest.raises(NoSpaceError):
        tier.put("e", value(4))
    assert tier.batch_put([("e", value(4))])[0].__class__ is NoSpaceError
    tier.check_integrity()
    assert tier.unpin("a")
    tier.put("e", value(4))  # a is the only evictable one now
    assert evicted == ["c", "a"]
    assert bytes(held.buffer) == value(1)
    held.release()
    tier.abort(writing)
    tier.put("f", value(5))  # a free block now: nothing evicted
    assert evicted == ["c", "a"] and sorted(tier.keys()) == ["b", "d", "e", "f"]
    tier.check_integrity()


def test_remove_of_acquired_frees_block_at_release() -> None:
    tier = make_tier(4)
    tier.put("a", value(1))
    with tier.acquire("a") as handle:  # type: ignore[union-attr]
        assert tier.remove("a") is True
        assert tier.exists("a") is False and tier.remove("a") is False
        assert tier.kv.pool.free_count == 3
        tier.put("a", value(2))  # the key can be reused; the old block stays held
        assert bytes(handle.buffer) == value(1)
        tier.check_integrity()
    handle.release()  # idempotent
    assert tier.kv.pool.free_count == 3 and tier.get("a") == value(2)
    assert tier.acquire("missing") is None
    tier.check_integrity()


def test_batch_put_get_exists_per_key_results() -> None:
    tier = make_tier(4)
    results = tier.batch_put(
        [("a", value(1)), ("b", value(2, 100)), ("a", value(3)), ("c", bytearray(value(4)))]
    )
    assert [type(r) if r else None for r in results] == [None, BadRequestError, ExistsError, None]
    assert tier.batch_get(["c", "missing", "a", "c"]) == [value(4), None, value(1), value(4)]
    assert tier.batch_exists(["a", "b", "c"]) == [True, False, True]
    assert tier.batch_get([]) == [] and tier.batch_put([]) == []
    tier.check_integrity()


def test_get_into_writes_caller_buffer() -> None:
    tier = make_tier()
    tier.put("a", value(1))
    out = bytearray(600)
    assert tier.get_into("a", memoryview(out)) == 512
    assert bytes(out[:512]) == value(1) and out[512:] == bytearray(88)
    assert tier.get_into("zz", memoryview(out)) is None


def test_failing_evict_callback_still_evicts() -> None:
    tier = make_tier(2)

    def boom(key: str, view: memoryview) -> None:
        raise RuntimeError("demotion failed")

    tier.set_evict_callback(boom)
    tier.put("a", value(1))
    tier.put("b", value(2))
    tier.put("c", value(3))
    assert tier.keys() == ["b", "c"] and tier.stats().evictions == 1
    tier.check_integrity()


def test_concurrent_puts_gets_removes_keep_integrity() -> None:
    tier = make_tier(3)  # fewer blocks than threads: puts evict each other's keys
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            for i in range(40):
                key = f"{w}-{i}"
                tier.put(key, value(i))
                if tier.get(key) not in (None, value(i)):
                    raise AssertionError(f"wrong bytes for {key}")
                if i % 2:
                    tier.remove(key)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and not any(t.is_alive() for t in threads)
    tier.check_integrity()
    assert len(tier.keys()) + tier.kv.pool.free_count == 3
    assert tier.stats().evictions > 0


def test_close_makes_tier_unavailable() -> None:
    tier = make_tier()
    tier.put("a", value(1))
    handle = tier.acquire("a")
    tier.close()
    with pytest.raises(UnavailableError):
        tier.get("a")
    handle.release()  # type: ignore[union-attr]


def test_tier_batches_move_in_staging_chunks() -> None:
    tier = HbmTier(HbmConfig(SMALL, 5, "cpu", staging_bytes=2 * SMALL.block_bytes))
    keys = [f"k{i}" for i in range(5)]
    assert tier.batch_put([(k, value(i)) for i, k in enumerate(keys)]) == [None] * 5
    assert tier.batch_get(keys[::-1]) == [value(i) for i in range(5)][::-1]
    assert tier.kv._host_staging is not None and tier.kv._host_staging.shape[0] == 2  # bounded
    tier.check_integrity()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_tier_on_each_device(device: str) -> None:
    tier = HbmTier(HbmConfig(SMALL, 4, device=device))
    evicted: list[tuple[str, bytes]] = []
    tier.set_evict_callback(lambda key, view: evicted.append((key, bytes(view))))
    tier.put("a", value(0))
    assert tier.batch_put([(k, value(i + 1)) for i, k in enumerate("bcde")]) == [None] * 4
    assert evicted == [("a", value(0))]
    assert tier.batch_get(list("abcde")) == [None, value(1), value(2), value(3), value(4)]
    out = bytearray(SMALL.block_bytes)
    assert tier.get_into("c", memoryview(out)) == SMALL.block_bytes and out == value(2)
    handle = tier.reserve("f", SMALL.block_bytes)
    handle.buffer[:] = value(5)
    tier.commit(handle)  # evicts b, the least recently used
    assert evicted[-1] == ("b", value(1)) and tier.get("f") == value(5)
    tier.check_integrity()
