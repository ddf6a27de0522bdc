"""Pool planner: how many prefill and how many decode nodes the observed load needs.

Prefill demand (busy nodes) = request rate x prefill time of the uncached part.
Decode demand = output token rate / one node's decode throughput, where a node
runs the largest batch whose step time meets the TBT objective and whose KV fits.
The nodes are split in proportion to the two demands (at least one each).

`search_split` refines that guess with an evaluator (the simulator on an observed trace
window, `kvstore.sim.search`): DistServe's placement search simulates candidate
configurations for goodput; here the candidates are colocated and the splits around the
demand split, and the choice says when no candidate meets the objectives.

`rank_splits` is the exhaustive form for pools small enough to try every split (16
nodes: 16 simulations of a window): every split is scored on the first observed window,
the best few on the others too, and the mean over the windows decides. Splits within
`tie` of the best are told apart by their attainment under more load (headroom), then
by nearness to the demand split. Why several windows: in overload attainment is a sharp
function of the split, and one window's mix of prompt and output lengths ranks the
splits differently from the next (measured on the Mooncake trace: the 5-minute windows
differ by 7% in mean prompt length, and at 1.25x its rate the best split of one window
attains 0.63x of the best on the other); the mean over windows is the lower-variance
forecast of the traffic to come.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


@dataclass(frozen=True, slots=True)
class Demand:
    """Busy nodes the observed load needs in each phase, and the decode batch it assumes."""

    prefill_nodes: float
    decode_nodes: float
    batch: int  # largest decode batch meeting the TBT objective whose KV fits
    tokens_per_s: float  # one decode node's throughput at that batch


def demand(
    load: ObservedLoad, latency: LatencyModel, tbt_slo_s: float, kv_capacity_tokens: int
) -> Demand:
    """Prefill demand = rate x prefill time of the uncached part; decode demand = output
    token rate / one node's throughput at the largest batch meeting `tbt_slo_s`."""
    new = load.mean_prompt_tokens - load.mean_cached_tokens
    prefill = load.request_rate * latency.prefill_s(round(new), round(load.mean_cached_tokens))
    ctx = load.mean_prompt_tokens + load.mean_output_tokens / 2
    per_seq = load.mean_prompt_tokens + load.mean_output_tokens
    batch = max_decode_batch(latency, tbt_slo_s, ctx, kv_capacity_tokens, per_seq)
    per_node = batch / latency.decode_step_s(batch, round(batch * ctx))
    return Demand(prefill, load.request_rate * load.mean_output_tokens / per_node, batch, per_node)


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
    d = demand(load, latency, tbt_slo_s, kv_capacity_tokens)
    prefill, decode, batch, per_node = d.prefill_nodes, d.decode_nodes, d.batch, d.tokens_per_s
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


@dataclass(frozen=True, slots=True)
class SplitChoice:
    """The split a search recommends: `prefill_nodes` of the total (0 = every node colocated),
    the score it reached, whether that meets the target, and every split it tried."""

    prefill_nodes: int
    score: float
    met: bool
    tried: dict[int, float]
    reason: str


def search_split(
    evaluate: Callable[[int], float],
    total_nodes: int,
    start: int,
    *,
    target: float = 0.9,
    radius: int = 2,
    max_evals: int = 12,
) -> SplitChoice:
    """Best split by `evaluate(prefill_nodes) -> attainment` (0 = colocated, else that many
    PREFILL nodes and the rest DECODE), searched around `start` (e.g. `plan_pools`'s
    demand split): colocated and start +- radius, then on towards a better edge while it
    improves (at most `max_evals` evaluations). Ties go to the split nearer `start`.
    When no split reaches `target` the choice says so and is the closest one."""
    if total_nodes < 2 or radius < 0 or max_evals < 1:
        raise BadRequestError("need total_nodes >= 2, radius >= 0 and max_evals >= 1")
    start = min(max(start, 1), total_nodes - 1)
    tried: dict[int, float] = {}

    def score(k: int) -> float:
        if k not in tried:
            tried[k] = evaluate(k)
        return tried[k]

    for k in (0, *range(max(start - radius, 1), min(start + radius, total_nodes - 1) + 1)):
        if len(tried) < max_evals:
            score(k)
    _extend(score, tried, total_nodes, max_evals)
    best = max(tried, key=lambda k: (tried[k], -abs(k - start), -k))
    return _choice(best, tried, target)


def _extend(
    score: Callable[[int], float], tried: dict[int, float], total: int, max_evals: int
) -> None:
    """While the best split is at an edge of the tried range, try one step beyond it."""
    while len(tried) < max_evals:
        split = {k: v for k, v in tried.items() if k > 0}
        if not split:
            return
        best = max(split, key=lambda k: (split[k], -k))
        lo, hi = min(split), max(split)
        step = best - 1 if best == lo and lo > 1 else best + 1 if best == hi else None
        if step is None or not 1 <= step <= total - 1 or step in tried:
            return
        if score(step) <= split[best]:
            return


def _choice(best: int, tried: dict[int, float], target: float) -> SplitChoice:
    name = "colocated" if best == 0 else f"{best} prefill"
    met = tried[best] >= target
    if met:
        reason = f"{name}: attainment {tried[best]:.3f} >= {target}"
    else:
        reason = (
            f"no split tried meets the objectives (attainment >= {target}); "
            f"closest: {name} at {tried[best]:.3f}"
        )
    return SplitChoice(best, tried[best], met, dict(sorted(tried.items())), reason)


EXHAUSTIVE_MAX = 16  # pools up to this many nodes try every split (one simulation each)


def rank_splits(
    evaluate: Callable[[int, int], float],
    windows: int,
    total_nodes: int,
    start: int,
    *,
    target: float = 0.9,
    shortlist: int = 4,
    tie: float = 0.005,
    headroom: Callable[[int], float] | None = None,
) -> SplitChoice:
    """Best split by `evaluate(prefill_nodes, window) -> attainment` over `windows` observed
    windows, trying every split (0 = colocated) on window 0 and the `shortlist` best of
    those on every window; the highest mean wins. Shortlisted splits within `tie` of it
    go to the highest `headroom(k)` (attainment at more load), then the one nearer `start`,
    then fewer prefill nodes. When none reaches `target` the choice says so and is the
    closest. `tried` holds each split's mean over the windows it was evaluated on."""
    if total_nodes < 2 or windows < 1 or shortlist < 1 or tie < 0:
        raise BadRequestError("need total_nodes >= 2, windows >= 1, shortlist >= 1, tie >= 0")
    start = min(max(start, 1), total_nodes - 1)
    first = {k: evaluate(k, 0) for k in range(total_nodes)}
    near = sorted(first, key=lambda k: (-first[k], abs(k - start), k))[:shortlist]
    mean = {k: (first[k] + sum(evaluate(k, w) for w in range(1, windows))) / windows
            for k in near}  # fmt: skip
    top = max(mean.values())
    tied = [k for k in near if mean[k] >= top - tie]
    room = {k: headroom(k) for k in tied} if headroom is not None and len(tied) > 1 else {}
    best = min(tied, key=lambda k: (-room.get(k, 0.0), abs(k - start), k))
    tried = {**first, **mean}
    choice = _choice(best, tried, target)
    how = f"every split tried on window 0, {len(near)} best on {windows} windows"
    if room:
        how += "; ties by headroom " + ", ".join(f"{k}: {v:.3f}" for k, v in sorted(room.items()))
    return SplitChoice(choice.prefill_nodes, choice.score, choice.met, choice.tried,
                       f"{choice.reason} ({how})")  # fmt: skip
