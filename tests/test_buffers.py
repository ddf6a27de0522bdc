"""kvstore.buffers.byte_view: the one conversion of user memory, the same for every
user (DRAM tier, transfer engines, client); and the layers that must stay light."""

from __future__ import annotations

import mmap
import subprocess
import sys

import numpy as np
import pytest
import torch

from kvstore.buffers import byte_view
from kvstore.errors import BadRequestError
from kvstore.tiers.dram import DramConfig, DramTier
from kvstore.tiers.ssd import SsdConfig, SsdTier
from kvstore.tiers.tiered import TieredStore
from kvstore.transfer.shm import ShmEngine


def test_byte_views_share_memory_of_every_buffer_kind() -> None:
    arr = np.zeros((4, 8), dtype=np.float32)
    view = byte_view(arr, writable=True)
    assert view.nbytes == 128 and view.format == "B" and view.ndim == 1
    view[0:4] = np.float32(1.5).tobytes()
    assert arr[0, 0] == 1.5
    tensor = torch.zeros(16, dtype=torch.bfloat16)
    byte_view(tensor, writable=True)[0:2] = (
        torch.tensor([2.0], dtype=torch.bfloat16).view(torch.uint8).numpy()
    )
    assert tensor[0].item() == 2.0
    with mmap.mmap(-1, 4096) as m:
        assert byte_view(m, writable=True).nbytes == 4096
    assert byte_view(bytearray(7), writable=True).nbytes == 7
    assert bytes(byte_view(b"abc")) == b"abc"  # read-only sources are fine to read from
    assert byte_view(memoryview(bytearray(12)).cast("I")).nbytes == 12
    assert byte_view(torch.zeros(0)).nbytes == 0


@pytest.mark.parametrize(
    "bad",
    ["str", 42, None, np.zeros((4, 4))[:, 1], torch.zeros(4, 4).t(), memoryview(b"abcd")[::2]],
)
def test_unusable_buffers_are_rejected(bad: object) -> None:
    with pytest.raises(BadRequestError):
        byte_view(bad)


def _read_only_array() -> np.ndarray:
    arr = np.zeros(4)
    arr.flags.writeable = False
    return arr


@pytest.mark.parametrize("make", [lambda: b"readonly", lambda: memoryview(b"ro"), _read_only_array])
def test_read_only_buffers_are_rejected_as_targets(make) -> None:
    with pytest.raises(BadRequestError, match="read-only"):
        byte_view(make(), writable=True)


KINDS = [
    lambda: bytearray(b"0123456789abcdef"),
    lambda: np.frombuffer(b"0123456789abcdef", dtype=np.uint8).reshape(4, 4).copy(),
    lambda: np.frombuffer(b"0123456789abcdef", dtype=np.float32).copy(),
    lambda: torch.frombuffer(bytearray(b"0123456789abcdef"), dtype=torch.bfloat16),
    lambda: memoryview(bytearray(b"0123456789abcdef")),
]


@pytest.mark.parametrize("make", KINDS)
def test_tiers_and_engines_accept_the_same_kinds(make, tmp_path) -> None:
    ssd = SsdTier(SsdConfig(directory=str(tmp_path), capacity_bytes=1 << 20))
    dram = DramTier(DramConfig(capacity_bytes=1 << 12))
    store = TieredStore([dram, ssd])
    try:
        for tier in (dram, ssd, store):
            tier.put(f"k{id(tier)}", make())
            out = make()
            byte_view(out, writable=True)[:] = bytes(16)
            assert tier.get_into(f"k{id(tier)}", out) == 16
            assert bytes(byte_view(out)) == b"0123456789abcdef"
    finally:
        store.close()
    with ShmEngine() as engine:
        assert engine.register("b", make()).size == 16


def test_tiers_and_master_metadata_import_neither_grpc_nor_torch() -> None:
    code = (
        "import sys, kvstore.tiers.dram, kvstore.tiers.ssd, kvstore.tiers.shm, kvstore.buffers\n"
        "import kvstore.master.metadata\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'grpc', 'torch'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
