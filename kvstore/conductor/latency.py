"""Latency and transfer models used by the conductor's policies (no grpc, no torch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kvstore.errors import BadRequestError
from kvstore.types import Tier


@runtime_checkable
class LatencyModel(Protocol):
    """Predicts compute time of one prefill and one decode step on one node."""

    def prefill_s(self, new_tokens: int, cached_tokens: int) -> float:
        """Seconds to prefill `new_tokens` on top of `cached_tokens` already in KV."""
        ...

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """Seconds of one decode step of `batch` sequences with `context_tokens` in total."""
        ...


@dataclass(frozen=True, slots=True)
class TransferModel:
    """Time to bring cached KV into a prefill node's HBM.

    `tier_bytes_per_s[t]` is the read bandwidth of tier `t` (indexed by `Tier`);
    a block on another node (pooled mode) moves at min(its tier, the network).
    `overhead_s` is paid once per request that loads anything.
    """

    kv_bytes_per_token: int
    tier_bytes_per_s: tuple[float, float, float] = (4.0e12, 55e9, 3.0e9)
    network_bytes_per_s: float = 25e9
    overhead_s: float = 0.001

    def __post_init__(self) -> None:
        if self.kv_bytes_per_token <= 0:
            raise BadRequestError(f"kv_bytes_per_token must be > 0, got {self.kv_bytes_per_token}")
        if len(self.tier_bytes_per_s) != len(Tier) or min(self.tier_bytes_per_s) <= 0:
            raise BadRequestError(f"need {len(Tier)} positive tier bandwidths")
        if self.network_bytes_per_s <= 0 or self.overhead_s < 0:
            raise BadRequestError("network bandwidth must be > 0 and overhead >= 0")

    def bandwidth(self, tier: Tier, remote: bool) -> float:
        """Bytes/s at which a block in `tier` reaches the prefill node."""
        bw = self.tier_bytes_per_s[int(tier)]
        return min(bw, self.network_bytes_per_s) if remote else bw

    def load_s(self, tier_tokens: Mapping[Tier, int], remote: bool) -> float:
        """Seconds to load `tier_tokens` (tokens per tier); 0 when nothing is loaded."""
        total = sum(tier_tokens.values())
        if total <= 0:
            return 0.0
        secs = sum(
            n * self.kv_bytes_per_token / self.bandwidth(t, remote) for t, n in tier_tokens.items()
        )
        return self.overhead_s + secs
