"""Online role flips: move nodes between the prefill and the decode pool as the mix shifts.

Every period the caller gives the balancer the requests seen in it; the balancer turns
them into an `ObservedLoad`, asks `plan_pools` for the demand split and compares it with
the current one. Hysteresis keeps roles still under noise: a flip happens only when the
recommendation differs from the current split by at least `margin` nodes for `patience`
periods in a row (in the same direction), and then only `max_flips` nodes move per
period, each the least busy node of the pool that shrinks (its queued and running work
finishes; new work follows its new role). A quiet period (no request) changes nothing.

Deterministic and grpc-free: the simulator drives it (`kvstore.sim.replay.Control`);
a conductor would call `observe` from its refresh loop and apply the flips to its nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvstore.conductor.api import NodeState, Request, Role
from kvstore.conductor.latency import LatencyModel
from kvstore.conductor.planner import ObservedLoad, plan_pools
from kvstore.errors import BadRequestError


@dataclass(frozen=True, slots=True)
class BalancerConfig:
    """Knobs of the online balancer."""

    period_s: float = 60.0
    margin: int = 1  # flip when the recommendation differs by at least this many nodes ...
    patience: int = 2  # ... for this many periods in a row
    max_flips: int = 1  # nodes moved per period
    hit_ratio: float = 0.0  # share of prompt tokens the pool is expected to hold

    def __post_init__(self) -> None:
        if not self.period_s > 0 or self.margin < 1 or self.patience < 1 or self.max_flips < 1:
            raise BadRequestError(f"bad balancer config {self}")
        if not 0 <= self.hit_ratio <= 1:
            raise BadRequestError(f"hit_ratio must be in [0, 1], got {self.hit_ratio}")


@dataclass(frozen=True, slots=True)
class Flip:
    """Node `node_id` takes role `role` (PREFILL or DECODE) from now on."""

    node_id: str
    role: Role
    reason: str


@dataclass(slots=True)
class RoleBalancer:
    """Tracks the prefill:decode split of a pool and recommends flips (see module doc)."""

    latency: LatencyModel
    tbt_slo_s: float
    kv_capacity_tokens: int
    config: BalancerConfig = field(default_factory=BalancerConfig)
    streak: int = 0  # periods in a row the recommendation pointed one way (sign = way)
    history: list[tuple[int, int]] = field(default_factory=list)  # (current, recommended)

    def observe(self, reqs: Sequence[Request], nodes: Sequence[NodeState]) -> list[Flip]:
        """The flips for one period in which `reqs` arrived, on a pool of `nodes` (PREFILL
        and DECODE; COLOCATED nodes are left alone)."""
        pool = [n for n in nodes if n.role in (Role.PREFILL, Role.DECODE)]
        if len(pool) < 2 or not reqs:
            return []
        current = sum(n.role == Role.PREFILL for n in pool)
        load = ObservedLoad.from_requests(reqs, self.config.period_s, self.config.hit_ratio)
        plan = plan_pools(load, len(pool), self.latency, self.tbt_slo_s, self.kv_capacity_tokens)
        want = plan.prefill_nodes
        self.history.append((current, want))
        way = 0 if abs(want - current) < self.config.margin else (1 if want > current else -1)
        self.streak = self.streak + way if way and self.streak * way >= 0 else way
        if not way or abs(self.streak) < self.config.patience:
            return []
        self.streak = 0
        moves = min(abs(want - current), self.config.max_flips)
        why = f"demand split {want}:{len(pool) - want}, had {current}:{len(pool) - current}"
        return _pick(pool, Role.DECODE if way > 0 else Role.PREFILL, moves, why)


def _pick(pool: Sequence[NodeState], source: Role, moves: int, why: str) -> list[Flip]:
    """The `moves` least busy nodes of role `source`, flipped to the other role; a pool
    keeps at least one node of each role."""
    members = [n for n in pool if n.role == source]
    moves = min(moves, len(members) - 1)
    target = Role.PREFILL if source == Role.DECODE else Role.DECODE

    def busy(n: NodeState) -> tuple[float, int, str]:
        return (n.est_queue_wait_s, n.running_decode_seqs, n.node_id)

    return [Flip(n.node_id, target, why) for n in sorted(members, key=busy)[:moves]]
