"""HBM tier: KV layout math, batched offload/onload, block pool, tier semantics."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

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
from kvstore.tiers.block_pool import BlockPool
from kvstore.tiers.hbm import HbmConfig, HbmKVPool, HbmTier, KVLayout
from kvstore.tiers.kv_layout import (
    block_to_bytes,
    bytes_as_block,
    bytes_into_block,
    resolve_device,
    writable_block,
)
from kvstore.types import Tier

DTYPES = ["float16", "bfloat16", "float32"]
SMALL = KVLayout(num_layers=2, block_tokens=4, kv_heads=2, head_dim=8)  # 512-byte blocks


def filled_pool(dtype: str = "float16", device: str = "cpu", num_blocks: int = 8) -> HbmKVPool:
    layout = KVLayout(num_layers=3, block_tokens=4, kv_heads=2, head_dim=8, dtype=dtype)
    pool = HbmKVPool(HbmConfig(layout, num_blocks, device=device))
    gen = torch.Generator().manual_seed(7)
    for layer in pool.layers:
        layer.copy_(torch.randn(layer.shape, generator=gen).to(layer.dtype))
    return pool


def value(i: int, size: int = SMALL.block_bytes) -> bytes:
    return random.Random(i).randbytes(size)


def make_tier(num_blocks: int = 4) -> HbmTier:
    return HbmTier(HbmConfig(SMALL, num_blocks, device="cpu"))


# -- layout ----------------------------------------------------------------------


def test_layout_math() -> None:
    layout = KVLayout(num_layers=32, block_tokens=16, kv_heads=8, head_dim=128)
    assert layout.block_bytes_per_layer == 64 * 1024
    assert layout.block_bytes == 32 * 64 * 1024
    assert layout.torch_dtype is torch.float16
    assert layout.host_shape(3) == (3, 32, 2, 16, 8, 128)
    fp32 = KVLayout(num_layers=2, block_tokens=4, kv_heads=1, head_dim=8, dtype="float32")
    assert (fp32.block_bytes_per_layer, fp32.block_bytes) == (256, 512)
    assert KVLayout(1, 1, 1, 1, dtype="bfloat16").torch_dtype is torch.bfloat16
    assert HbmConfig(layout, 10).capacity_bytes == 10 * layout.block_bytes


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_layers": 0},
        {"block_tokens": -1},
        {"kv_heads": True},
        {"head_dim": 1.5},
        {"dtype": "float64"},
    ],
)
def test_layout_rejects_bad_fields(kwargs: dict[str, object]) -> None:
    fields: dict[str, object] = {"num_layers": 1, "block_tokens": 1, "kv_heads": 1, "head_dim": 1}
    with pytest.raises(BadRequestError):
        KVLayout(**{**fields, **kwargs})  # type: ignore[arg-type]


def test_config_rejects_bad_fields() -> None:
    with pytest.raises(BadRequestError):
        HbmConfig(SMALL, 0)
    with pytest.raises(BadRequestError):
        HbmConfig(SMALL, 4, device="no-such-device")
    with pytest.raises(BadRequestError):
        HbmConfig("layout", 4)  # type: ignore[arg-type]


def test_auto_device_follows_cuda() -> None:
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(BadRequestError):
            resolve_device("cuda")


# -- offload / onload ------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_offload_then_onload_elsewhere_reproduces_blocks(dtype: str) -> None:
    pool = filled_pool(dtype)
    src, dst = [5, 0, 7, 3], [1, 2, 4, 6]
    before = [layer.clone() for layer in pool.layers]
    host = pool.offload(src)
    assert host.shape == pool.layout.host_shape(4)
    for i, b in enumerate(src):
        for n, layer in enumerate(pool.layers):
            assert torch.equal(host[i, n], layer[b])
    pool.onload(host, dst)
    for s, d in zip(src, dst, strict=True):
        for n, layer in enumerate(pool.layers):
            assert torch.equal(layer[d], before[n][s])
            assert torch.equal(layer[s], before[n][s])


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_and_naive_agree(dtype: str) -> None:
    pool = filled_pool(dtype)
    ids = [6, 1, 1, 4]  # a repeated block is fine for reads
    batched = pool.offload(ids)
    assert torch.equal(batched, pool.offload_naive(ids))
    a, b = filled_pool(dtype), filled_pool(dtype)
    a.onload(batched[:3], [0, 7, 2])
    b.onload_naive(batched[:3], [0, 7, 2])
    for la, lb in zip(a.layers, b.layers, strict=True):
        assert torch.equal(la, lb)
    assert torch.equal(a.layers[1][7], pool.layers[1][1])


def test_offload_writes_into_given_buffer_and_empty_ids() -> None:
    pool = filled_pool()
    out = pool.new_host_buffer(2)
    assert pool.offload([3, 4], out=out) is out
    assert torch.equal(out[1, 2], pool.layers[2][4])
    assert pool.offload([]).shape == pool.layout.host_shape(0)
    staging = pool.host_staging(2)
    assert pool.host_staging(1).data_ptr() == staging.data_ptr()  # reused, not reallocated


def test_offload_onload_reject_bad_input_and_leave_pool_unchanged() -> None:
    pool = filled_pool()
    before = [layer.clone() for layer in pool.layers]
    host = pool.offload([0, 1])
    bad_calls = [
        lambda: pool.offload([8]),
        lambda: pool.offload([-1]),
        lambda: pool.offload([True]),
        lambda: pool.onload(host, [2, 2]),
        lambda: pool.onload(host, [2]),
        lambda: pool.onload(host.float(), [2, 3]),
        lambda: pool.onload(host.transpose(0, 1).contiguous().transpose(0, 1), [2, 3]),
        lambda: pool.offload([0], out=torch.empty(5)),
    ]
    for call in bad_calls:
        with pytest.raises(BadRequestError):
            call()
    for layer, old in zip(pool.layers, before, strict=True):
        assert torch.equal(layer, old)
    assert pool.pool.free_count == 8


def test_bytes_helpers_round_trip_and_share_memory() -> None:
    pool = filled_pool("bfloat16")
    block = pool.offload([2])[0]
    raw = bytes(block_to_bytes(block))
    assert raw == block.view(torch.uint8).numpy().tobytes()
    assert torch.equal(bytes_as_block(raw, pool.layout), block)  # read-only source: copied
    shared = bytearray(raw)
    view = bytes_as_block(shared, pool.layout)  # writable source: zero-copy
    shared[0:2] = b"\x00\x00"
    assert view.reshape(-1)[0].item() == 0.0
    out = pool.new_host_buffer(1)[0]
    assert torch.equal(bytes_into_block(raw, out), block)
    with pytest.raises(BadRequestError):
        bytes_into_block(raw[:-2], out)
    with pytest.raises(TooLargeError):
        bytes_as_block(raw + b"xx", pool.layout)
    target = bytearray(pool.layout.block_bytes + 3)
    writable_block(target, pool.layout)[0].copy_(block)
    assert bytes(target[: len(raw)]) == raw


# -- block pool ------------------------------------------------------------------


def test_block_pool_ref_counts_and_fifo_reuse() -> None:
    pool = BlockPool(5)
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.allocate(3) is None and pool.free_count == 2  # all-or-nothing
    assert pool.incref(1) == 2
    assert pool.decref(1) is False and pool.ref_count(1) == 1
    assert pool.decref(1) is True and pool.ref_count(1) == 0
    assert pool.decref(0) is True
    pool.check_integrity()
    assert pool.allocate(4) == [3, 4, 1, 0]  # least recently freed first
    assert pool.allocate(0) == [] and pool.free_count == 0
    pool.check_integrity()


def test_block_pool_rejects_bad_calls_and_detects_corruption() -> None:
    pool = BlockPool(3)
    for call in (
        lambda: pool.decref(0),
        lambda: pool.incref(0),
        lambda: pool.ref_count(3),
        lambda: pool.allocate(-1),
        lambda: BlockPool(0),
    ):
        with pytest.raises(BadRequestError):
            call()
    pool.check_integrity()
    pool.allocate(1)
    pool._free.append(0)  # corrupt: block 0 both in use and free
    with pytest.raises(AssertionError):
        pool.check_integrity()


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


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_offload_onload_and_tier(dtype: str) -> None:
    pool = filled_pool(dtype, device="cuda", num_blocks=64)
    src, dst = [40, 3, 17, 63], [0, 1, 2, 5]
    host = pool.offload(src)
    assert host.is_pinned() and torch.equal(host, pool.offload_naive(src))
    pool.onload(host, dst)
    for s, d in zip(src, dst, strict=True):
        for layer in pool.layers:
            assert torch.equal(layer[d], layer[s])
    tier = HbmTier(HbmConfig(SMALL, 4, device="cuda"))
    tier.batch_put([(k, value(i)) for i, k in enumerate("abcde")])
    assert tier.batch_get(list("abcde")) == [None, value(1), value(2), value(3), value(4)]
    tier.check_integrity()


@pytest.mark.slow
def test_bench_script_runs_and_verifies() -> None:
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "bench/hbm_offload.py", "--json", "--blocks", "8", "--layers", "2"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["verified"] is True and result["bytes_per_pass"] == 8 * 2 * 64 * 1024
    assert set(result["gbps"]) == {
        "bulk_d2h",
        "batched_offload",
        "naive_offload",
        "bulk_h2d",
        "batched_onload",
        "naive_onload",
    }
