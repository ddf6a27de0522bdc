"""Pool sizing with the simulator: fixed splits, the planner's choice, online role flips.

A *split* of `total` nodes is `k` PREFILL + `total - k` DECODE nodes, or every node
COLOCATED for `k = 0`. `run_split` simulates one split under one policy; `plan_split` is
the planner: the demand split of `plan_pools` on observed windows, refined with the
simulator as its evaluator on those windows (never on the requests it will be judged
on): every split for pools of up to 16 nodes, else `search_split` around the demand
split; `balancer_control` lets a `RoleBalancer` flip roles while a simulation runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from kvstore.conductor.api import Role
from kvstore.conductor.latency import LatencyModel, TransferModel
from kvstore.conductor.planner import (
    EXHAUSTIVE_MAX,
    ObservedLoad,
    SplitChoice,
    plan_pools,
    rank_splits,
    search_split,
)
from kvstore.conductor.registry import make_policy
from kvstore.conductor.roles import RoleBalancer
from kvstore.errors import BadRequestError
from kvstore.sim.cache import TierCapacity
from kvstore.sim.cluster import NodeSpec, SimCluster, uniform_nodes
from kvstore.sim.metrics import LatencySummary, summarize
from kvstore.sim.replay import Control, Outcome, Slo, simulate, to_request
from kvstore.sim.traces import TraceLoad, TraceRequest, scale_rate


@dataclass(frozen=True, slots=True)
class Pool:
    """What every node of a uniform pool has: prefix cache, KV memory, latency model."""

    total: int
    cache: TierCapacity
    kv_capacity_tokens: int
    latency: LatencyModel
    transfer: TransferModel
    pooled: bool = True
    max_context_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.total < 1 or self.kv_capacity_tokens <= 0:
            raise BadRequestError(f"empty cluster: a pool needs nodes and KV memory ({self})")


def split_specs(pool: Pool, k: int) -> tuple[NodeSpec, ...]:
    """`k` PREFILL + the rest DECODE nodes (k = 0: every node COLOCATED)."""
    if not 0 <= k < pool.total or (k and pool.total < 2):
        raise BadRequestError(f"split {k} of {pool.total} nodes leaves a pool empty")
    kv, ctx = pool.kv_capacity_tokens, pool.max_context_tokens
    if k == 0:
        return uniform_nodes(pool.total, Role.COLOCATED, pool.cache, kv, max_context_tokens=ctx)
    pre = uniform_nodes(k, Role.PREFILL, pool.cache, kv, "p", max_context_tokens=ctx)
    dec = uniform_nodes(pool.total - k, Role.DECODE, pool.cache, kv, "d", max_context_tokens=ctx)
    return pre + dec


def run_split(
    load: TraceLoad,
    pool: Pool,
    k: int,
    policy: str,
    slo: Slo,
    control: Control | None = None,
    latencies: Mapping[str, LatencyModel] | None = None,
) -> list[Outcome]:
    """Simulate `load` on split `k` placed by a fresh `policy` (admission off)."""
    pol = make_policy(
        policy,
        latency=pool.latency,
        transfer=pool.transfer,
        admission=False,
        tbt_budget_s=slo.tbt_s,
        latencies=latencies,
    )
    specs = split_specs(pool, k)
    return simulate(
        load, specs, pol, pool.latency, pool.transfer, pooled=pool.pooled, slo=slo,
        latencies=latencies, control=control,
    )  # fmt: skip


def attainment(load: TraceLoad, pool: Pool, k: int, policy: str, slo: Slo) -> LatencySummary:
    return summarize(run_split(load, pool, k, policy, slo), slo)


def demand_split(load: TraceLoad, pool: Pool, slo: Slo, window_s: float) -> int:
    """plan_pools' split of the pool for the requests of `load` seen over `window_s`."""
    reqs = [to_request(r, slo) for r in load.requests]
    observed = ObservedLoad.from_requests(reqs, window_s)
    try:
        plan = plan_pools(observed, pool.total, pool.latency, slo.tbt_s, pool.kv_capacity_tokens)
    except BadRequestError:  # no batch meets the TBT objective: start from the middle
        return pool.total // 2
    return plan.prefill_nodes


def horizon_windows(
    load: TraceLoad, start_s: float, count: int, windows: int, rate: float
) -> list[TraceLoad]:
    """What the planner observes to forecast `count` requests at `rate` (a horizon of
    `count / rate` seconds): the next `windows` runs of `count` requests of `load`
    arriving from `start_s` on, each replayed at `rate` so that it spans that horizon
    (the last may be shorter where the trace ends; none if no request follows `start_s`).

    Why runs of equal count rather than windows of equal time: in overload the queue
    grows for as long as the burst lasts, so a split's attainment falls with the
    burst's length. Time windows of a trace hold different counts (the Azure
    conversation trace's first three 120 s windows hold 456, 682 and 580 requests), and
    replayed at one rate they last different times: a forecast 1.5x longer than the
    horizon judges every split by a deeper queue than the one it will serve."""
    if count < 1 or windows < 1 or not rate > 0:
        raise BadRequestError(
            f"need count >= 1, windows >= 1, rate > 0 ({count}, {windows}, {rate})"
        )
    after = [r for r in load.requests if r.arrival_s >= start_s]
    out: list[TraceLoad] = []
    for i in range(windows):
        run = after[i * count : (i + 1) * count]
        if not run:
            break
        t0 = run[0].arrival_s
        # the run's own rate: `len(run)` gaps up to the next run's first arrival (at the
        # trace's end, the mean gap within the run stands in for the last one)
        if len(after) > (i + 1) * count:
            span = after[(i + 1) * count].arrival_s - t0
        else:
            span = (run[-1].arrival_s - t0) * len(run) / max(len(run) - 1, 1)
        reqs = tuple(replace(r, req_id=j, arrival_s=r.arrival_s - t0) for j, r in enumerate(run))
        own = TraceLoad(reqs)
        out.append(scale_rate(own, rate * span / len(run)) if span > 0 else own)
    return out


HEADROOM = 1.25  # ties between splits: judged again at this much more load


def plan_split(
    observed: TraceLoad | Sequence[TraceLoad],
    pool: Pool,
    slo: Slo,
    window_s: float,
    policy: str,
    radius: int = 2,
) -> SplitChoice:
    """The planner: the demand split of the observed windows (each `window_s` long), then
    every split simulated on them (`rank_splits`; ties judged at `HEADROOM` x the load)
    when the pool has at most `EXHAUSTIVE_MAX` nodes, else `search_split` around the
    demand split on their mean. Never simulates the requests it will be judged on."""
    wins = [observed] if isinstance(observed, TraceLoad) else list(observed)
    if not wins or not all(w.requests for w in wins):
        raise BadRequestError("the planner needs at least one observed window with requests")
    joined = TraceLoad(tuple(r for w in wins for r in w.requests))
    start = demand_split(joined, pool, slo, window_s * len(wins))
    memo: dict[tuple[int, int, float], float] = {}

    def att(k: int, w: int, more: float = 1.0) -> float:
        if (k, w, more) not in memo:
            load = wins[w] if more == 1.0 else scale_rate(wins[w], more)
            memo[k, w, more] = attainment(load, pool, k, policy, slo).attained
        return memo[k, w, more]

    if pool.total <= EXHAUSTIVE_MAX:
        return rank_splits(
            att, len(wins), pool.total, start,
            headroom=lambda k: sum(att(k, w, HEADROOM) for w in range(len(wins))) / len(wins),
        )  # fmt: skip
    return search_split(
        lambda k: sum(att(k, w) for w in range(len(wins))) / len(wins),
        pool.total,
        start,
        radius=radius,
    )


def balancer_control(
    balancer: RoleBalancer,
    slo: Slo,
    pool: Pool | None = None,
    policy: str = "flexible",
    warmup_s: float = 120.0,
) -> Control:
    """A simulation control that applies the balancer's flips every period. With `pool`,
    the balancer's evaluator is the simulator (`_evaluator`): the requests of the last
    period and of the `warmup_s` before it (they rebuild the queues and the decode streams
    in flight that a fresh cluster lacks: make it as long as a stream lives) replayed
    under `policy`, for each candidate split."""
    recent: list[list[TraceRequest]] = []
    keep = 1 + math.ceil(warmup_s / balancer.config.period_s)

    def tick(cluster: SimCluster, seen: Sequence[TraceRequest]) -> None:
        reqs = [to_request(r, slo) for r in seen]
        recent.append(list(seen))
        del recent[:-keep]
        evaluate = None
        if pool is not None and seen:
            current = sum(n.role == Role.PREFILL for n in cluster.nodes.values())
            future = math.ceil(balancer.config.horizon_periods)
            evaluate = _evaluator(recent, pool, current, policy, slo, future)
        for flip in balancer.observe(reqs, cluster.node_states(), evaluate):
            cluster.set_role(flip.node_id, flip.role)

    return Control(tick, balancer.config.period_s)


def _evaluator(
    periods: Sequence[Sequence[TraceRequest]],
    pool: Pool,
    current: int,
    policy: str,
    slo: Slo,
    future_periods: int,
) -> Callable[[int], tuple[float, int]]:
    """Split -> (requests within the objectives, requests) when the cluster runs the
    recent periods on the `current` split (warm-up: the queues and decode streams in
    flight now), flips to `k` now, and then serves `future_periods` more periods like
    the last one (its requests again, as new prompts). The flip's cost (drain, stalled
    streams, a pool one node short meanwhile) and its gain are both in the count;
    requests done before the flip are the same for every candidate."""
    every = [r for p in periods for r in p]
    t0 = min(r.arrival_s for r in every)
    last = periods[-1]
    span = max(r.arrival_s for r in every) - t0
    period_s = max(span - (min(r.arrival_s for r in last) - t0), 1e-9)
    reqs = [replace(r, arrival_s=r.arrival_s - t0) for r in every]
    block = 1 + max((b for r in every for b in r.blocks), default=0)
    for i in range(future_periods):
        shift, offset = period_s * (i + 1), block * (i + 1)
        for r in last:
            reqs.append(TraceRequest(
                len(reqs) + 10**9, r.arrival_s - t0 + shift, r.input_len,
                r.output_len, tuple(b + offset for b in r.blocks),
            ))  # fmt: skip
    reqs.sort(key=lambda r: r.arrival_s)
    load = TraceLoad(tuple(reqs))
    cache: dict[int, tuple[float, int]] = {}

    def evaluate(k: int) -> tuple[float, int]:
        if k not in cache:
            control = _flip_at(span, k) if k != current else None
            outs = run_split(load, pool, current if control is not None else k, policy, slo,
                             control)  # fmt: skip
            cache[k] = (summarize(outs, slo).attained * len(outs), len(outs))
        return cache[k]

    return evaluate


def _flip_at(at_s: float, k: int) -> Control:
    """Flip the least busy nodes at `at_s` so that `k` nodes prefill (a one-shot control)."""
    done = False

    def fn(cluster: SimCluster, seen: Sequence[TraceRequest]) -> None:
        nonlocal done
        if done or cluster.loop.now < at_s:
            return
        done = True
        states = sorted(cluster.node_states(), key=lambda n: (n.est_queue_wait_s,
                        n.running_decode_seqs, n.node_id))  # fmt: skip
        have = sum(n.role == Role.PREFILL for n in states)
        source = Role.DECODE if k > have else Role.PREFILL
        target = Role.PREFILL if source == Role.DECODE else Role.DECODE
        for n in [n for n in states if n.role == source][: abs(k - have)]:
            cluster.set_role(n.node_id, target)

    return Control(fn, 1.0)
