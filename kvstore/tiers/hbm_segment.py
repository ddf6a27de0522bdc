"""A segment of device memory (HBM) lent to the pool: one uint8 torch tensor.

On a CUDA device the bytes live in GPU memory: peers read and write them over TCP
through a staging copy (pinned host memory; one bulk copy per request), and the
node's own moves (offload to DRAM, promotion from it) copy device <-> host
directly. On the CPU device (machines without a GPU, and the tests) the same
class serves the tensor's memory as a plain buffer, so the pool path is the
same code. torch is imported when a segment is made, never at module import.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kvstore.errors import BadRequestError, NoSpaceError
from kvstore.types import Tier


class HbmSegment:
    """`size` bytes on `device` ("cpu", "cuda", "cuda:1", ...) named `name`."""

    tier = Tier.HBM
    shm = False

    def __init__(self, name: str, size: int, device: str = "cuda") -> None:
        import torch

        if size <= 0:
            raise BadRequestError(f"HBM segment size must be > 0, got {size}")
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise BadRequestError(f"device {device!r} requested but CUDA is not available")
        try:
            self.tensor = torch.empty(size, dtype=torch.uint8, device=dev)
        except RuntimeError as exc:  # CUDA out of memory and friends
            raise NoSpaceError(f"cannot allocate {size} bytes on {device}: {exc}") from exc
        self.name = name
        self.device = dev
        self._lock = threading.Lock()
        self._host = dev.type == "cpu"

    @property
    def size(self) -> int:
        return int(self.tensor.numel())

    @property
    def nbytes(self) -> int:
        return self.size

    @property
    def buffer(self) -> memoryview | None:
        """The bytes as host memory (CPU device only); None on a GPU."""
        if not self._host:
            return None
        return self.tensor.numpy().data.cast("B")

    def _check(self, offset: int, length: int) -> None:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise BadRequestError(f"range [{offset}, +{length}) is outside HBM segment")

    def read_range(self, offset: int, length: int) -> tuple[memoryview, Callable[[], None]]:
        """Stage [offset, offset+length) to host memory (one device -> host copy)."""
        self._check(offset, length)
        host = self._staging(length)
        host.copy_(self.tensor[offset : offset + length])
        return memoryview(host.numpy()).cast("B"), lambda: None

    def write_range(self, offset: int, length: int, fill: Callable[[memoryview], None]) -> None:
        """`fill` host staging, then one host -> device copy."""
        self._check(offset, length)
        host = self._staging(length)
        fill(memoryview(host.numpy()).cast("B"))
        self.tensor[offset : offset + length].copy_(host)

    def view(self, offset: int, length: int) -> Any:
        """The device tensor slice [offset, offset+length) (node-local moves)."""
        self._check(offset, length)
        return self.tensor[offset : offset + length]

    def _staging(self, length: int) -> Any:
        import torch

        pin = self.device.type == "cuda" and torch.cuda.is_available()
        return torch.empty(length, dtype=torch.uint8, pin_memory=pin)

    def close(self) -> None:
        self.tensor = self.tensor.new_empty(0)
