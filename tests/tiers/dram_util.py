"""Helpers of the DRAM tier tests: a settable clock, small tiers, values."""

from __future__ import annotations

from collections.abc import Iterator

from kvstore.tiers.dram import DramConfig, DramTier

BLOCK = 64


class FakeClock:
    """A monotonic clock the test moves by hand (for leases)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_tier(blocks: int, clock: FakeClock, high: float = 1.0, low: float = 1.0) -> DramTier:
    """A tier of `blocks` 64-byte slots; by default it evicts only when full."""
    config = DramConfig(blocks * BLOCK, high_watermark=high, low_watermark=low, alignment=BLOCK)
    return DramTier(config, clock=clock)


def small_tier(clock: FakeClock) -> Iterator[DramTier]:
    """Body of a `tier` fixture: four slots, integrity checked at the end."""
    with make_tier(4, clock) as t:
        yield t
        t.check_integrity()


def val(key: str, size: int = BLOCK) -> bytes:
    return (key.encode() * size)[:size]
