"""Pool sizing with the simulator: fixed splits, the planner's choice, online role flips.

A *split* of `total` nodes is `k` PREFILL + `total - k` DECODE nodes, or every node
COLOCATED for `k = 0`. `run_split` simulates one split under one policy; `plan_split` is
the planner: the demand split of `plan_pools` on an observed window, refined by
`search_split` with the simulator as its evaluator on that window (never on the requests
it will be judged on); `balancer_control` lets a `RoleBalancer` flip roles while a
simulation runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvstore.conductor.api import Role
from kvstore.conductor.latency import LatencyModel, TransferModel
from kvstore.conductor.planner import ObservedLoad, SplitChoice, plan_pools, search_split
from kvstore.conductor.registry import make_policy
from kvstore.conductor.roles import RoleBalancer
from kvstore.errors import BadRequestError
from kvstore.sim.cache import TierCapacity
from kvstore.sim.cluster import NodeSpec, SimCluster, uniform_nodes
from kvstore.sim.metrics import LatencySummary, summarize
from kvstore.sim.replay import Control, Outcome, Slo, simulate, to_request
from kvstore.sim.traces import TraceLoad, TraceRequest


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


def plan_split(
    observed: TraceLoad, pool: Pool, slo: Slo, window_s: float, policy: str, radius: int = 2
) -> SplitChoice:
    """The planner: demand split on `observed`, refined by simulating `observed` itself."""
    start = demand_split(observed, pool, slo, window_s)
    return search_split(
        lambda k: attainment(observed, pool, k, policy, slo).attained,
        pool.total,
        start,
        radius=radius,
    )


def balancer_control(balancer: RoleBalancer, slo: Slo) -> Control:
    """A simulation control that applies the balancer's flips every period."""

    def tick(cluster: SimCluster, seen: Sequence[TraceRequest]) -> None:
        reqs = [to_request(r, slo) for r in seen]
        for flip in balancer.observe(reqs, cluster.node_states()):
            cluster.set_role(flip.node_id, flip.role)

    return Control(tick, balancer.config.period_s)
