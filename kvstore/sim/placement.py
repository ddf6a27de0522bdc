"""Hardware and parallelism with the simulator: heterogeneous pools and DistServe placement.

`goodput_search` finds the highest request rate whose attainment reaches the target
(DistServe's goodput) by growing the rate from a start until it fails, then bisecting.

Heterogeneous pools (Splitwise, ISCA'24): a `Fleet` is prefill and decode (or colocated)
nodes, each a `NodeKind` (profile on a machine, with its cost and power). `splitwise_fleet`
builds its configurations: Baseline-A100 / Baseline-H100 (every machine colocated),
Splitwise-AA / -HH / -HA (H100 prefill, A100 decode) / -HHcap (H100 prefill, power-capped
H100 decode), and `demand_split_kinds` sizes the prefill pool from each side's own
latency model.

DistServe placement (OSDI'24): a search over the TP degree and the instance count of
each phase (within the profiles the data has; no pipeline parallelism, which they do not
cover) for the highest goodput per GPU, every candidate filling the same GPU budget and
judged by a full simulation (DistServe's Algorithm 1 simulates one instance per phase and
scales it linearly; here each whole deployment is simulated, so pooled queueing over
several instances counts), against colocated deployments on the same GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvstore.conductor.api import Role
from kvstore.conductor.hardware import NodeKind
from kvstore.conductor.planner import ObservedLoad, max_decode_batch
from kvstore.conductor.registry import make_policy
from kvstore.errors import BadRequestError
from kvstore.sim.cache import TierCapacity
from kvstore.sim.cluster import NodeSpec
from kvstore.sim.metrics import GOODPUT_ATTAINMENT, LatencySummary
from kvstore.sim.replay import Outcome, Slo, simulate, to_request
from kvstore.sim.traces import TraceLoad

Run = Callable[[float], LatencySummary]


@dataclass(frozen=True, slots=True)
class GoodputResult:
    """Goodput (0 when even the lowest rate tried fails) and every (rate, attainment) tried."""

    goodput: float
    points: tuple[tuple[float, float], ...]


def goodput_search(
    run: Run,
    start: float,
    *,
    target: float = GOODPUT_ATTAINMENT,
    grow: float = 1.6,
    steps: int = 8,
    bisect: int = 3,
    score: Callable[[LatencySummary], float] = lambda s: s.attained,
) -> GoodputResult:
    """Highest rate with `score(run(rate)) >= target`: up (or down) from `start` by `grow`
    until the outcome changes (at most `steps` times), then `bisect` halvings."""
    if not start > 0 or grow <= 1 or steps < 1 or bisect < 0:
        raise BadRequestError("goodput search needs start > 0, grow > 1, steps >= 1")
    points: list[tuple[float, float]] = []

    def ok(rate: float) -> bool:
        value = score(run(rate))
        points.append((rate, value))
        return value >= target

    lo, hi = _bracket(ok, start, grow, steps)
    if lo is None or hi is None:
        return GoodputResult(lo or 0.0, tuple(points))
    for _ in range(bisect):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return GoodputResult(lo, tuple(points))


def _bracket(
    ok: Callable[[float], bool], start: float, grow: float, steps: int
) -> tuple[float | None, float | None]:
    """(a passing rate, a failing rate just above it); None where none was found."""
    if ok(start):
        lo, rate = start, start
        for _ in range(steps):
            rate *= grow
            if not ok(rate):
                return lo, rate
            lo = rate
        return lo, None
    hi, rate = start, start
    for _ in range(steps):
        rate /= grow
        if ok(rate):
            return rate, hi
        hi = rate
    return None, hi


# -- heterogeneous fleets -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fleet:
    """A named deployment: `prefill` kinds (PREFILL nodes; COLOCATED when `decode` is
    empty) and `decode` kinds (DECODE nodes)."""

    name: str
    prefill: tuple[NodeKind, ...]
    decode: tuple[NodeKind, ...] = ()

    def __post_init__(self) -> None:
        if not self.prefill:
            raise BadRequestError(f"fleet {self.name}: empty cluster (no prefill nodes)")

    @property
    def kinds(self) -> tuple[NodeKind, ...]:
        return self.prefill + self.decode

    @property
    def cost_per_hour(self) -> float:
        return sum(k.cost_per_hour for k in self.kinds)

    @property
    def power_kw(self) -> float:
        return sum(k.power_w for k in self.kinds) / 1e3

    @property
    def gpus(self) -> int:
        return sum(k.gpus for k in self.kinds)

    def describe(self) -> str:
        def count(kinds: tuple[NodeKind, ...]) -> str:
            names = sorted({k.profile.name for k in kinds})
            return " + ".join(f"{sum(k.profile.name == n for k in kinds)}x {n}" for n in names)

        if not self.decode:
            return f"{count(self.prefill)} colocated"
        return f"{count(self.prefill)} prefill, {count(self.decode)} decode"

    def specs(self, cache: TierCapacity) -> tuple[NodeSpec, ...]:
        role = Role.PREFILL if self.decode else Role.COLOCATED
        out = [_spec(f"p{i}", role, k, cache) for i, k in enumerate(self.prefill)]
        out += [_spec(f"d{i}", Role.DECODE, k, cache) for i, k in enumerate(self.decode)]
        return tuple(out)


def _spec(node_id: str, role: Role, kind: NodeKind, cache: TierCapacity) -> NodeSpec:
    p = kind.profile
    return NodeSpec(node_id, role, cache, p.kv_capacity_tokens, p.name, p.max_context_tokens)


def run_fleet(
    load: TraceLoad, fleet: Fleet, slo: Slo, cache: TierCapacity, policy: str = "cache_load"
) -> list[Outcome]:
    """Simulate `load` on `fleet`; each node runs its own profile's latency model."""
    lats = {k.profile.name: k.profile.latency for k in fleet.kinds}
    first = fleet.kinds[0].profile
    pol = make_policy(
        policy, latency=first.latency, transfer=first.transfer, admission=False,
        tbt_budget_s=slo.tbt_s, latencies=lats,
    )  # fmt: skip
    specs = fleet.specs(cache)
    return simulate(load, specs, pol, first.latency, first.transfer, slo=slo, latencies=lats)


def demand_split_kinds(
    load: ObservedLoad, total: int, prefill: NodeKind, decode: NodeKind, tbt_slo_s: float
) -> int:
    """Prefill nodes of `total` for `load` when prefill runs on `prefill` and decode on
    `decode`: each side's demand from its own latency model (plan_pools' rule)."""
    new = load.mean_prompt_tokens - load.mean_cached_tokens
    pre_lat, dec = prefill.profile.latency, decode.profile
    pre = load.request_rate * pre_lat.prefill_s(round(new), round(load.mean_cached_tokens))
    ctx = load.mean_prompt_tokens + load.mean_output_tokens / 2
    per_seq = load.mean_prompt_tokens + load.mean_output_tokens
    try:
        batch = max_decode_batch(dec.latency, tbt_slo_s, ctx, dec.kv_capacity_tokens, per_seq)
    except BadRequestError:
        return total // 2
    per_node = batch / dec.latency.decode_step_s(batch, round(batch * ctx))
    need = load.request_rate * load.mean_output_tokens / per_node
    if pre + need <= 0:
        return total // 2
    return min(max(round(total * pre / (pre + need)), 1), total - 1)


def splitwise_fleets(
    kinds: dict[str, NodeKind], machines: int, observed: ObservedLoad, tbt_slo_s: float
) -> list[Fleet]:
    """Splitwise's configurations on `machines` nodes of `kinds` ("a100", "h100",
    "h100pcap"), each split sized by `demand_split_kinds`."""
    a, h, cap = kinds["a100"], kinds["h100"], kinds["h100pcap"]
    fleets = [Fleet("Baseline-A100", (a,) * machines), Fleet("Baseline-H100", (h,) * machines)]
    for name, pk, dk in (
        ("Splitwise-AA", a, a),
        ("Splitwise-HH", h, h),
        ("Splitwise-HA", h, a),
        ("Splitwise-HHcap", h, cap),
    ):
        k = demand_split_kinds(observed, machines, pk, dk, tbt_slo_s)
        fleets.append(Fleet(name, (pk,) * k, (dk,) * (machines - k)))
    return fleets


# -- DistServe placement --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    """One disaggregated deployment of the search: instances and TP per phase."""

    prefill: NodeKind
    prefill_instances: int
    decode: NodeKind
    decode_instances: int

    @property
    def gpus(self) -> int:
        return self.prefill_instances * self.prefill.gpus + self.decode_instances * self.decode.gpus

    def fleet(self) -> Fleet:
        pre = (self.prefill,) * self.prefill_instances
        return Fleet("DistServe", pre, (self.decode,) * self.decode_instances)

    def describe(self) -> str:
        return (
            f"{self.prefill_instances}x prefill TP{self.prefill.gpus} + "
            f"{self.decode_instances}x decode TP{self.decode.gpus}"
        )


def candidates(kinds: Sequence[NodeKind], gpu_budget: int) -> list[Candidate]:
    """Every (TP, instances) per phase that uses exactly `gpu_budget` GPUs, one instance
    of each phase at least; BadRequestError when none fits."""
    out = []
    for pk in kinds:
        for dk in kinds:
            for n_p in range(1, gpu_budget // pk.gpus + 1):
                rest = gpu_budget - n_p * pk.gpus
                if rest >= dk.gpus and rest % dk.gpus == 0:
                    out.append(Candidate(pk, n_p, dk, rest // dk.gpus))
    if not out:
        raise BadRequestError(f"no placement of these TP degrees fills {gpu_budget} GPUs")
    return out


@dataclass(frozen=True, slots=True)
class PlacementResult:
    """The best candidate, its goodput, and every candidate's goodput (by description)."""

    best: Candidate
    goodput: float
    tried: dict[str, float]

    @property
    def per_gpu(self) -> float:
        return self.goodput / self.best.gpus


def search_placement(
    kinds: Sequence[NodeKind], gpu_budget: int, goodput: Callable[[Fleet], float]
) -> PlacementResult:
    """The candidate of highest goodput (per GPU: all use the budget); ties: fewer
    instances."""
    tried: dict[str, float] = {}
    best: tuple[float, int, Candidate] | None = None
    for cand in candidates(kinds, gpu_budget):
        g = goodput(cand.fleet())
        tried[cand.describe()] = g
        key = (g, -(cand.prefill_instances + cand.decode_instances), cand)
        if best is None or key[:2] > best[:2]:
            best = key
    assert best is not None
    return PlacementResult(best[2], best[0], tried)


def observed_load(load: TraceLoad, slo: Slo) -> ObservedLoad:
    """The mean figures of a trace window (no prefix reuse assumed)."""
    reqs = [to_request(r, slo) for r in load.requests]
    span = max(load.requests[-1].arrival_s - load.requests[0].arrival_s, 1e-9)
    return ObservedLoad.from_requests(reqs, span)
