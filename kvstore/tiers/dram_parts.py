"""The DRAM tier's config, per-object entry, read/write handles and buffer checks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvstore.errors import BadRequestError, TooLargeError
from kvstore.tiers.shm import check_segment_name
from kvstore.types import ObjectKey

if TYPE_CHECKING:
    from kvstore.tiers.dram import DramTier


@dataclass(frozen=True, slots=True)
class DramConfig:
    """One DRAM tier: its size, shared-memory name (None: a fresh unique one),
    eviction watermarks (fractions of capacity) and allocation alignment."""

    capacity_bytes: int
    segment_name: str | None = None
    high_watermark: float = 0.95
    low_watermark: float = 0.85
    alignment: int = 64

    def __post_init__(self) -> None:
        align = self.alignment
        if not _is_int(align) or align <= 0 or align & (align - 1):
            raise BadRequestError(f"alignment must be a power of two, got {align!r}")
        cap = self.capacity_bytes
        if not _is_int(cap) or cap <= 0 or cap % align:
            raise BadRequestError(f"capacity_bytes must be a positive multiple of {align}: {cap!r}")
        if self.segment_name is not None:
            check_segment_name(self.segment_name)
        low, high = self.low_watermark, self.high_watermark
        if not all(isinstance(w, int | float) and not isinstance(w, bool) for w in (low, high)):
            raise BadRequestError("watermarks must be numbers")
        if not 0.0 < low <= high <= 1.0:
            raise BadRequestError(f"need 0 < low_watermark <= high_watermark <= 1: {low}, {high}")


@dataclass(slots=True, eq=False)
class DramEntry:
    """One object's bookkeeping: where it lives and what protects it."""

    key: ObjectKey
    offset: int
    size: int
    committed: bool = False
    readers: int = 0
    pins: int = 0
    lease_until: float = -math.inf
    doomed: bool = False


class DramWriteHandle:
    """A reserved object: fill `buffer` (exactly `size` bytes), then commit or abort."""

    __slots__ = ("_entry", "_tier", "_view", "key", "size")

    def __init__(self, tier: DramTier, entry: DramEntry, view: memoryview) -> None:
        self.key = entry.key
        self.size = entry.size
        self._tier: DramTier | None = tier
        self._entry = entry
        self._view: memoryview | None = view

    @property
    def buffer(self) -> memoryview:
        if self._view is None:
            raise BadRequestError(f"write handle of {self.key!r} is already committed or aborted")
        return self._view

    def _finish(self) -> None:
        self._tier = None
        self._view = None

    def __repr__(self) -> str:
        state = "open" if self._view is not None else "finished"
        return f"DramWriteHandle({self.key!r}, size={self.size}, {state})"


class DramReadHandle:
    """A committed object held against eviction and freeing until `release`."""

    __slots__ = ("_entry", "_tier", "_view", "key", "size")

    def __init__(self, tier: DramTier, entry: DramEntry, view: memoryview) -> None:
        self.key = entry.key
        self.size = entry.size
        self._tier: DramTier | None = tier
        self._entry = entry
        self._view: memoryview | None = view

    @property
    def buffer(self) -> memoryview:
        """The object's bytes, read-only, valid until `release`."""
        if self._view is None:
            raise BadRequestError(f"read handle of {self.key!r} is released")
        return self._view

    def release(self) -> None:
        """Drop the hold (idempotent)."""
        tier, self._tier, self._view = self._tier, None, None
        if tier is not None:
            tier._release(self._entry)

    def __enter__(self) -> DramReadHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self._view is not None else "released"
        return f"DramReadHandle({self.key!r}, size={self.size}, {state})"


def check_size(size: object, capacity: int) -> int:
    """A valid object size: a positive int no larger than the tier."""
    if not _is_int(size):
        raise BadRequestError(f"size must be an int, got {type(size).__name__}")
    if size <= 0:  # type: ignore[operator]
        raise BadRequestError(f"size must be positive, got {size}")
    if size > capacity:  # type: ignore[operator]
        raise TooLargeError(f"{size} bytes exceed the tier's capacity of {capacity}")
    return size  # type: ignore[return-value]


def source_view(value: object) -> memoryview:
    """A flat byte view of a value to store (any C-contiguous buffer)."""
    try:
        view = memoryview(value)  # type: ignore[arg-type]
    except TypeError:
        kind = type(value).__name__
        raise BadRequestError(f"value must be a bytes-like object, got {kind}") from None
    return _flat(view)


def target_view(out: object) -> memoryview:
    """A flat writable byte view of a caller's output buffer."""
    try:
        view = memoryview(out)  # type: ignore[arg-type]
    except TypeError:
        raise BadRequestError(f"out must be a writable buffer, got {type(out).__name__}") from None
    if view.readonly:
        raise BadRequestError("out buffer is read-only")
    return _flat(view)


def _flat(view: memoryview) -> memoryview:
    if view.format == "B" and view.ndim == 1:
        return view
    if not view.c_contiguous:
        raise BadRequestError("buffer must be C-contiguous")
    return view.cast("B")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
