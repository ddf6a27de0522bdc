"""Online role flips: move nodes between the prefill and the decode pool as the mix shifts.

Every period the caller gives the balancer the requests seen in it and the pool's node
states. A flip is a bet: it pays only if the split it leads to serves the coming
requests better, by more than the flip itself costs. So, per period:

1. **Candidates.** The current split `k` (prefill nodes) and `k +- max_flips`.
2. **Predicted gain.** With an `evaluate(k)` (how many requests would meet their
   objectives if the pool flipped to split `k` now and the next `horizon_periods`
   periods looked like the last one: in the simulator, `kvstore.sim.search.
   balancer_control` replays the recent periods, flips, and replays the last period
   again, so the transition, drain included, is in the prediction), a candidate's gain
   is `evaluate(k') - evaluate(k)` requests. Without an
   evaluator it falls back to the demand split of `plan_pools` (which does not know
   that decode nodes under the `flexible` policy prefill too: measured, it flipped decode
   nodes to prefill for long prompts and lost 2.4 points of attainment).
3. **Cost.** Flipping node `n` costs the time it cannot serve its new role: a decode
   node must drain its running streams (their remaining tokens at its current step
   time) or move their KV away (context tokens x KV bytes per token / network
   bandwidth), whichever is shorter; a prefill node must finish its queued prefills.
   In requests: `requests per second x cost_s / pool size` (its share of the pool's
   capacity, gone for that long), plus `min_gain` x the requests the evaluator judged
   (a floor against the simulator's noise: attainment is not smooth in the split).
4. **Hysteresis.** The best candidate must beat its cost for `patience` periods in a
   row (in the same direction); a node just flipped is not flipped back within
   `cooldown_periods`; at most `max_flips` nodes move per period, each the cheapest of
   the shrinking pool. A quiet period changes nothing and resets the streak.

Deterministic and grpc-free. A conductor would call `observe` from its refresh loop
with an analytic or simulated evaluator and apply the flips to its nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvstore.conductor.api import NodeState, Request, Role
from kvstore.conductor.latency import LatencyModel, TransferModel
from kvstore.conductor.planner import ObservedLoad, plan_pools
from kvstore.errors import BadRequestError

# prefill nodes -> (predicted requests within their objectives, requests predicted)
Evaluator = Callable[[int], tuple[float, int]]


@dataclass(frozen=True, slots=True)
class BalancerConfig:
    """Knobs of the online balancer."""

    period_s: float = 60.0
    margin: int = 1  # without an evaluator: flip when the demand split differs by this ...
    patience: int = 2  # ... (or the gain beats the cost) this many periods in a row
    max_flips: int = 1  # nodes moved per period
    hit_ratio: float = 0.0  # share of prompt tokens the pool is expected to hold
    horizon_periods: float = 2.0  # how long a new split is expected to pay off
    min_gain: float = 0.03  # gain (a share of the requests evaluated) that is noise
    cooldown_periods: int = 3  # a flipped node stays put this long

    def __post_init__(self) -> None:
        if not self.period_s > 0 or self.margin < 1 or self.patience < 1 or self.max_flips < 1:
            raise BadRequestError(f"bad balancer config {self}")
        if not 0 <= self.hit_ratio <= 1:
            raise BadRequestError(f"hit_ratio must be in [0, 1], got {self.hit_ratio}")
        if not self.horizon_periods > 0 or self.min_gain < 0 or self.cooldown_periods < 0:
            raise BadRequestError(f"bad balancer config {self}")


@dataclass(frozen=True, slots=True)
class Flip:
    """Node `node_id` takes role `role` (PREFILL or DECODE) from now on."""

    node_id: str
    role: Role
    reason: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """One period's reasoning (kept in `RoleBalancer.verdicts` for reports and tests)."""

    current: int
    best: int
    gain: float  # requests, over the horizon
    cost: float  # requests
    flipped: bool


@dataclass(slots=True)
class RoleBalancer:
    """Tracks the prefill:decode split of a pool and recommends flips (see module doc)."""

    latency: LatencyModel
    tbt_slo_s: float
    kv_capacity_tokens: int
    config: BalancerConfig = field(default_factory=BalancerConfig)
    transfer: TransferModel | None = None  # KV moves priced at its network bandwidth
    streak: int = 0  # periods in a row the recommendation pointed one way (sign = way)
    history: list[tuple[int, int]] = field(default_factory=list)  # (current, recommended)
    verdicts: list[Verdict] = field(default_factory=list)
    _period: int = 0
    _flipped_at: dict[str, int] = field(default_factory=dict)

    def observe(
        self, reqs: Sequence[Request], nodes: Sequence[NodeState], evaluate: Evaluator | None = None
    ) -> list[Flip]:
        """The flips for one period in which `reqs` arrived, on a pool of `nodes` (PREFILL
        and DECODE; COLOCATED nodes are left alone); `evaluate` predicts a split's
        attainment on these requests (None: the demand split decides the direction)."""
        self._period += 1
        pool = [n for n in nodes if n.role in (Role.PREFILL, Role.DECODE)]
        if len(pool) < 2 or not reqs:
            self.streak = 0
            return []
        current = sum(n.role == Role.PREFILL for n in pool)
        if evaluate is None:
            way, moves, why = self._by_demand(reqs, pool, current)
        else:
            way, moves, why = self._by_gain(reqs, pool, current, evaluate)
        self.streak = self.streak + way if way and self.streak * way >= 0 else way
        if not way or abs(self.streak) < self.config.patience:
            return []
        self.streak = 0
        flips = self._pick(pool, Role.DECODE if way > 0 else Role.PREFILL, moves, reqs, why)
        for f in flips:
            self._flipped_at[f.node_id] = self._period
        return flips

    def _by_demand(
        self, reqs: Sequence[Request], pool: Sequence[NodeState], current: int
    ) -> tuple[int, int, str]:
        load = ObservedLoad.from_requests(reqs, self.config.period_s, self.config.hit_ratio)
        plan = plan_pools(load, len(pool), self.latency, self.tbt_slo_s, self.kv_capacity_tokens)
        want = plan.prefill_nodes
        self.history.append((current, want))
        way = 0 if abs(want - current) < self.config.margin else (1 if want > current else -1)
        moves = min(abs(want - current), self.config.max_flips)
        why = f"demand split {want}:{len(pool) - want}, had {current}:{len(pool) - current}"
        return way, moves, why

    def _by_gain(
        self,
        reqs: Sequence[Request],
        pool: Sequence[NodeState],
        current: int,
        evaluate: Evaluator,
    ) -> tuple[int, int, str]:
        """The candidate whose predicted gain beats its flip cost by the most (0: none)."""
        n = len(pool)
        step = self.config.max_flips
        base, judged = evaluate(current)
        best = (0.0, 0, 0.0, 0.0)  # (net, way, gain, cost)
        for way in (1, -1):
            k = current + way * step
            if not 1 <= k <= n - 1:
                continue
            source = Role.DECODE if way > 0 else Role.PREFILL
            movable = self._movable(pool, source)
            if len(movable) < step or sum(x.role == source for x in pool) - step < 1:
                continue
            gain = evaluate(k)[0] - base
            cost_s = sum(sorted(self.flip_cost_s(x, reqs) for x in movable)[:step])
            cost = len(reqs) / self.config.period_s * cost_s / n
            cost += self.config.min_gain * judged
            if gain - cost > best[0]:
                best = (gain - cost, way, gain, cost)
        _, way, gain, cost = best
        want = current + way * step
        self.history.append((current, want))
        self.verdicts.append(Verdict(current, want, gain, cost, False))
        why = f"split {want}:{n - want} predicted +{gain:.1f} requests for a cost of {cost:.1f}"
        return way, step, why

    def flip_cost_s(self, node: NodeState, reqs: Sequence[Request]) -> float:
        """Seconds `node` cannot serve its new role: a decode node drains its streams (half
        the period's mean output left, at its current step time) or moves their KV,
        whichever is shorter; a prefill node finishes its queue."""
        if node.role == Role.PREFILL:
            return node.est_queue_wait_s
        if not node.running_decode_seqs:
            return 0.0
        mean_out = sum(r.output_tokens for r in reqs) / max(len(reqs), 1)
        step = self.latency.decode_step_s(node.running_decode_seqs, node.decode_context_tokens)
        drain = mean_out / 2 * step
        if self.transfer is None:
            return drain
        tr = self.transfer
        move = node.decode_context_tokens * tr.kv_bytes_per_token / tr.network_bytes_per_s
        return min(drain, tr.overhead_s + move)

    def _movable(self, pool: Sequence[NodeState], source: Role) -> list[NodeState]:
        """Nodes of role `source` outside their cooldown."""
        calm = self._period - self.config.cooldown_periods
        never = calm - 1
        return [
            n for n in pool if n.role == source and self._flipped_at.get(n.node_id, never) < calm
        ]

    def _pick(
        self, pool: Sequence[NodeState], source: Role, moves: int, reqs: Sequence[Request],
        why: str,
    ) -> list[Flip]:  # fmt: skip
        """The `moves` cheapest nodes of role `source` to flip; a pool keeps at least one
        node of each role."""
        members = self._movable(pool, source)
        moves = min(moves, sum(n.role == source for n in pool) - 1, len(members))
        target = Role.PREFILL if source == Role.DECODE else Role.DECODE

        def cost(n: NodeState) -> tuple[float, float, int, str]:
            busy = (n.est_queue_wait_s, n.running_decode_seqs, n.node_id)
            return (self.flip_cost_s(n, reqs), *busy)

        chosen = sorted(members, key=cost)[:moves]
        if chosen and self.verdicts:
            last = self.verdicts[-1]
            self.verdicts[-1] = Verdict(last.current, last.best, last.gain, last.cost, True)
        return [Flip(n.node_id, target, why) for n in chosen]
