"""HBM pool: KV layout math, batched offload/onload vs naive, bytes helpers, block pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvstore.errors import BadRequestError, TooLargeError
from kvstore.tiers.block_pool import BlockPool
from kvstore.tiers.kv_layout import (
    HbmConfig,
    KVLayout,
    block_to_bytes,
    bytes_as_block,
    bytes_into_block,
    resolve_device,
    writable_block,
)
from kvstore.tiers.kv_pool import HbmKVPool

DTYPES = ["float16", "bfloat16", "float32"]
SMALL = KVLayout(num_layers=2, block_tokens=4, kv_heads=2, head_dim=8)  # 512-byte blocks


def filled_pool(dtype: str = "float16", device: str = "cpu", num_blocks: int = 8) -> HbmKVPool:
    """A pool of 3 layers whose every block holds distinct random values."""
    layout = KVLayout(num_layers=3, block_tokens=4, kv_heads=2, head_dim=8, dtype=dtype)
    pool = HbmKVPool(HbmConfig(layout, num_blocks, device=device))
    gen = torch.Generator().manual_seed(7)
    for layer in pool.layers:
        layer.copy_(torch.randn(layer.shape, generator=gen).to(layer.dtype))
    return pool


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
        HbmConfig(SMALL, 4, staging_bytes=0)
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


def test_chunked_moves_match_naive() -> None:
    pool = filled_pool()
    layout = pool.layout
    small = HbmKVPool(HbmConfig(layout, 8, "cpu", staging_bytes=2 * layout.block_bytes + 1))
    assert small.config.staging_blocks == 2
    for mine, src in zip(small.layers, pool.layers, strict=True):
        mine.copy_(src)
    ids = [7, 0, 5, 2, 3]
    host = small.offload(ids)
    assert torch.equal(host, pool.offload_naive(ids))
    small.onload(host, [1, 2, 3, 4, 6])
    pool.onload_naive(host, [1, 2, 3, 4, 6])
    for mine, src in zip(small.layers, pool.layers, strict=True):
        assert torch.equal(mine, src)


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


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_offload_onload_on_each_device(device: str, dtype: str) -> None:
    pool = filled_pool(dtype, device=device, num_blocks=64)
    src, dst = [40, 3, 17, 63], [0, 1, 2, 5]
    host = pool.offload(src)
    assert host.device.type == "cpu" and host.is_pinned() == (device == "cuda")
    assert torch.equal(host, pool.offload_naive(src))
    pool.onload(host, dst)
    for s, d in zip(src, dst, strict=True):
        for layer in pool.layers:
            assert torch.equal(layer[d], layer[s])


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


def test_the_pool_is_laid_out_in_one_hbm_segment() -> None:
    """The engine's paged KV and the pool's HBM tier are one device memory: the layers
    are views of an HbmSegment, so a block written through the pool is in its bytes."""
    from kvstore.tiers.hbm_segment import HbmSegment

    layout = KVLayout(num_layers=3, block_tokens=4, kv_heads=2, head_dim=8, dtype="float16")
    with pytest.raises(BadRequestError, match="needs"):
        HbmKVPool(HbmConfig(layout, 8, "cpu"), HbmSegment("small", 100, "cpu"))
    seg = HbmSegment("kv", 1 << 20, "cpu")
    seg.tensor.fill_(0xAB)
    pool = HbmKVPool(HbmConfig(layout, 8, "cpu"), seg)
    assert all(int(layer.abs().sum()) == 0 for layer in pool.layers)  # zeroed on layout
    block = torch.arange(layout.block_bytes // 2, dtype=torch.float16).view(layout.host_shape(1))
    pool.onload(block, [5])
    raw = seg.buffer
    assert raw is not None
    layer_bytes = 8 * layout.block_bytes_per_layer
    start = 5 * layout.block_bytes_per_layer  # layer 0, block 5
    got = torch.frombuffer(bytearray(raw[start : start + layout.block_bytes_per_layer]),
                           dtype=torch.float16)  # fmt: skip
    assert torch.equal(got, block[0, 0].reshape(-1))
    stride = -(-layer_bytes // 256) * 256
    assert bytes(raw[stride * 3 : stride * 3 + 16]) == b"\xab" * 16  # past the pool: untouched
    assert torch.equal(pool.offload([5]), block)
    pool.close()
    assert seg.size == 1 << 20  # a lent segment outlives the pool laid out in it
