"""Pool planner: how many prefill and how many decode nodes the observed load needs.

Prefill demand (busy nodes) = request rate x prefill time of the uncached part.
Decode demand = output token rate / one node's decode throughput, where a node
runs the largest batch whose step time meets the TBT objective and whose KV fits.
The nodes are split in proportion to the two demands (at least one each).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.conductor.api import Request
from kvstore.conductor.latency import LatencyModel
from kvstore.errors import BadRequestError

MAX_BATCH = 1 << 16


@dataclass(frozen=True, slots=True)
class ObservedLoad:
    """Mean request figures over an observation window."""

    request_rate: float  # requests per second
    mean_prompt_tokens: float
    mean_cached_tokens: float
    mean_output_tokens: float

    def __post_init__(self) -> None:
        if self.request_rate < 0 or self.mean_prompt_tokens <= 0 or self.mean_output_tokens < 0:
            raise BadRequestError(f"bad observed load {self}")
        if not 0 <= self.mean_cached_tokens <= self.mean_prompt_tokens:
            raise BadRequestError("mean_cached_tokens must be within [0, mean_prompt_tokens]")

    @classmethod
    def from_requests(
        cls, reqs: Sequence[Request], window_s: float, hit_ratio: float = 0.0
    ) -> ObservedLoad:
        """Figures of `reqs` seen over `window_s` seconds, `hit_ratio` of prompt tokens cached."""
        if not reqs or window_s <= 0 or not 0 <= hit_ratio <= 1:
            raise BadRequestError("need requests, a positive window and a hit ratio in [0, 1]")
        prompt = sum(r.prompt_tokens for r in reqs) / len(reqs)
        output = sum(r.output_tokens for r in reqs) / len(reqs)
        return cls(len(reqs) / window_s, prompt, prompt * hit_ratio, output)


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """Recommended pool sizes, and why."""

    prefill_nodes: int
    decode_nodes: int
    reason: str


def max_decode_batch(
    latency: LatencyModel,
    tbt_slo_s: float,
    context_tokens: float,
    kv_capacity_tokens: int,
    seq_kv_tokens: float,
) -> int:
    """Largest batch whose step (mean context `context_tokens` per sequence) meets `tbt_slo_s`
    and whose KV (`seq_kv_tokens` per sequence) fits; BadRequestError if none does."""
    cap = min(MAX_BATCH, int(kv_capacity_tokens // max(seq_kv_tokens, 1.0)))
    if cap < 1 or latency.decode_step_s(1, round(context_tokens)) > tbt_slo_s:
        raise BadRequestError(
            f"impossible TBT objective {tbt_slo_s}s or KV capacity for context {context_tokens}"
        )
    lo, hi = 1, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if latency.decode_step_s(mid, round(mid * context_tokens)) <= tbt_slo_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_pools(
    load: ObservedLoad,
    total_nodes: int,
    latency: LatencyModel,
    tbt_slo_s: float,
    kv_capacity_tokens: int,
) -> PoolPlan:
    """Split `total_nodes` between prefill and decode in proportion to their demand."""
    if total_nodes < 2:
        raise BadRequestError(f"need at least 2 nodes to split, got {total_nodes}")
    new = load.mean_prompt_tokens - load.mean_cached_tokens
    prefill = load.request_rate * latency.prefill_s(round(new), round(load.mean_cached_tokens))
    ctx = load.mean_prompt_tokens + load.mean_output_tokens / 2
    per_seq = load.mean_prompt_tokens + load.mean_output_tokens
    batch = max_decode_batch(latency, tbt_slo_s, ctx, kv_capacity_tokens, per_seq)
    per_node = batch / latency.decode_step_s(batch, round(batch * ctx))
    decode = load.request_rate * load.mean_output_tokens / per_node
    if prefill + decode <= 0:
        p = total_nodes // 2
    else:
        p = min(max(round(total_nodes * prefill / (prefill + decode)), 1), total_nodes - 1)
    reason = (
        f"prefill demand {prefill:.2f} nodes, decode demand {decode:.2f} nodes "
        f"(batch {batch}, {per_node:.0f} tok/s per node)"
    )
    if prefill + decode > total_nodes:
        reason += f"; overloaded: {prefill + decode:.2f} > {total_nodes} nodes"
    return PoolPlan(p, total_nodes - p, reason)
