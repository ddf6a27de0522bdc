"""Drive the conductor's real policies over a trace: full event simulation, or routing only.

`simulate` runs every request through `SimCluster` (queues, batching, KV moves) and returns
one `Outcome` per request. `route_only` is the fast path for hit ratios: it asks the same
policy for a placement per request, keeps the caches exactly, and models each prefill node as
a FIFO server of predicted prefill seconds (no decode), which is enough load signal for
cache- and load-aware routing and runs the full Mooncake trace in seconds.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kvstore.conductor.api import ClusterView, NodeState, Policy, Request
from kvstore.conductor.errors import RejectedError
from kvstore.conductor.latency import LatencyModel, TransferModel
from kvstore.errors import BadRequestError
from kvstore.sim.cache import HitStats, hit_tokens
from kvstore.sim.cluster import Job, NodeSpec, SimCluster
from kvstore.sim.pool import make_pool
from kvstore.sim.traces import TraceLoad, TraceRequest


@dataclass(frozen=True, slots=True)
class Slo:
    """Objectives: time to first token and mean time between later tokens, seconds."""

    ttft_s: float
    tbt_s: float

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tbt_s > 0):
            raise BadRequestError(f"impossible objectives: ttft={self.ttft_s} tbt={self.tbt_s}")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one request (times None when rejected or unfinished)."""

    req_id: int
    ttft_s: float | None
    tbt_s: float | None
    cached_blocks: int
    total_blocks: int
    prefill_node: str | None
    decode_node: str | None
    rejected: bool = False
    too_long: bool = False  # longer than every node's context: never placed
    queue_s: float = 0.0  # TTFT parts (finished prefills): queue, prefix load by
    load_s: Mapping[str, float] = field(default_factory=dict)  # source and tier, compute
    compute_s: float = 0.0


def to_request(r: TraceRequest, slo: Slo | None) -> Request:
    """The conductor's Request for one trace request."""
    return Request(
        request_id=str(r.req_id),
        arrival_s=r.arrival_s,
        prompt_tokens=r.input_len,
        output_tokens=r.output_len,
        block_hashes=r.blocks,
        ttft_slo_s=slo.ttft_s if slo else None,
        tbt_slo_s=slo.tbt_s if slo else None,
    )


def _outcome(job: Job) -> Outcome:
    ttft = tbt = None
    if job.first_token_s is not None:
        ttft = job.first_token_s - job.arrival_s
    if job.finish_s is not None and job.first_token_s is not None:
        steps = max(job.req.output_len - 1, 1)
        tbt = (job.finish_s - job.first_token_s) / steps
    return Outcome(
        job.req.req_id,
        ttft,
        tbt,
        job.cached_blocks,
        len(job.req.blocks),
        job.prefill_node,
        job.decode_node,
        queue_s=job.queue_s,
        load_s=dict(job.load_s),
        compute_s=job.compute_s,
    )


Controller = Callable[[SimCluster, Sequence[TraceRequest]], None]


@dataclass(frozen=True, slots=True)
class Control:
    """Call `fn(cluster, requests seen in the last period)` every `period_s` simulated
    seconds while requests arrive (e.g. the online role balancer, `kvstore.conductor.roles`)."""

    fn: Controller
    period_s: float

    def __post_init__(self) -> None:
        if not self.period_s > 0:
            raise BadRequestError(f"control period must be > 0, got {self.period_s}")


def longest_context(specs: Sequence[NodeSpec]) -> int | None:
    """The longest prompt + output some node serves (None: no node has a limit)."""
    if not specs:
        raise BadRequestError("empty cluster: no node specs")
    limits = [s.max_context_tokens for s in specs]
    return None if None in limits else max(x for x in limits if x is not None)


def split_too_long(
    load: TraceLoad, specs: Sequence[NodeSpec]
) -> tuple[list[TraceRequest], list[TraceRequest]]:
    """(requests some node can serve, requests longer than every node's context)."""
    longest = longest_context(specs)
    if longest is None:
        return list(load.requests), []
    ok = [r for r in load.requests if r.input_len + r.output_len <= longest]
    return ok, [r for r in load.requests if r.input_len + r.output_len > longest]


def simulate(
    load: TraceLoad,
    specs: Sequence[NodeSpec],
    policy: Policy,
    latency: LatencyModel,
    transfer: TransferModel,
    *,
    pooled: bool = True,
    slo: Slo | None = None,
    latencies: Mapping[str, LatencyModel] | None = None,
    control: Control | None = None,
) -> list[Outcome]:
    """Replay `load` through a simulated cluster placed by `policy`; one Outcome per request.

    A request the policy rejects (RejectedError) gets a rejected Outcome and never runs; one
    longer than every node's context gets a `too_long` Outcome (count them with
    `sum(o.too_long ...)`); BadRequestError when every request is too long.
    """
    ok, long = split_too_long(load, specs)
    if not ok:
        raise BadRequestError(
            f"all {len(long)} requests exceed every node's context "
            f"({longest_context(specs)} tokens)"
        )
    cluster = SimCluster(specs, latency, transfer, pooled=pooled, latencies=latencies)
    outcomes = {
        r.req_id: Outcome(r.req_id, None, None, 0, len(r.blocks), None, None, True, True)
        for r in long
    }
    jobs: list[Job] = []

    def arrive(r: TraceRequest) -> None:
        view = ClusterView(cluster.node_states(), cluster.pool, pooled=pooled)
        try:
            d = policy.place(to_request(r, slo), view)
        except RejectedError:
            outcomes[r.req_id] = Outcome(r.req_id, None, None, 0, len(r.blocks), None, None, True)
            return
        job = Job(r, d.prefill_node, d.decode_node, cluster.loop.now)
        jobs.append(job)
        cluster.submit(job)

    for r in ok:
        cluster.loop.at(r.arrival_s, functools.partial(arrive, r))
    if control is not None:
        _schedule_control(cluster, ok, control)
    cluster.loop.run()
    cluster.check_integrity()
    outcomes.update((j.req.req_id, _outcome(j)) for j in jobs)
    return [outcomes[r.req_id] for r in load.requests]


def _schedule_control(cluster: SimCluster, reqs: Sequence[TraceRequest], ctl: Control) -> None:
    """Run the controller at every period boundary up to the last arrival."""
    end = reqs[-1].arrival_s if reqs else 0.0
    ticks = int(end // ctl.period_s)
    for k in range(1, ticks + 1):
        t = k * ctl.period_s
        seen = [r for r in reqs if t - ctl.period_s <= r.arrival_s < t]
        cluster.loop.at(t, functools.partial(ctl.fn, cluster, seen))


@dataclass(frozen=True, slots=True)
class RouteResult:
    """Hit ratio of a routing-only replay, and the prefill work each node got."""

    hits: HitStats
    node_busy_s: dict[str, float]
    rejected: int
    local_hit_blocks: int = 0  # hit blocks already on the prefill node (no network load)

    @property
    def local_share(self) -> float:
        """Fraction of hit blocks the prefill node held itself."""
        return self.local_hit_blocks / self.hits.hit_blocks if self.hits.hit_blocks else 0.0

    @property
    def load_imbalance(self) -> float:
        """max/mean predicted prefill seconds per node (1.0 = perfectly even)."""
        vals = list(self.node_busy_s.values())
        mean = sum(vals) / len(vals)
        return max(vals) / mean if mean > 0 else 1.0


class _FifoServer:
    """A node as a FIFO server of predicted prefill seconds."""

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.queue: deque[tuple[float, int]] = deque()  # (finish time, prompt tokens)
        self.busy_s = 0.0

    def state(self, now: float) -> NodeState:
        while self.queue and self.queue[0][0] <= now:
            self.queue.popleft()
        wait = self.queue[-1][0] - now if self.queue else 0.0
        cap = self.spec.kv_capacity_tokens
        return NodeState(
            node_id=self.spec.node_id,
            role=self.spec.role,
            queued_prefill_tokens=sum(t for _, t in self.queue),
            kv_free_tokens=cap,
            kv_capacity_tokens=cap,
            est_queue_wait_s=wait,
        )

    def serve(self, now: float, work_s: float, tokens: int) -> None:
        start = self.queue[-1][0] if self.queue and self.queue[-1][0] > now else now
        self.queue.append((start + work_s, tokens))
        self.busy_s += work_s


def route_only(
    load: TraceLoad,
    specs: Sequence[NodeSpec],
    policy: Policy,
    latency: LatencyModel,
    *,
    pooled: bool,
) -> RouteResult:
    """Place every request with `policy`; count the prefix hits its prefill node can use."""
    if not specs:
        raise BadRequestError("empty cluster: no node specs")
    servers = {s.node_id: _FifoServer(s) for s in specs}
    pool = make_pool({s.node_id: s.cache for s in specs}, pooled=pooled)
    hb = tb = ht = tt = rejected = local = 0
    for r in load.requests:
        now = r.arrival_s
        view = ClusterView(tuple(s.state(now) for s in servers.values()), pool, pooled=pooled)
        tb += len(r.blocks)
        tt += r.input_len
        try:
            d = policy.place(to_request(r, None), view)
        except RejectedError:
            rejected += 1
            continue
        hit = pool.prefix(d.prefill_node, r.blocks)
        n = hit.blocks
        local += sum(hit.local.values())
        cached = hit_tokens(r, n)
        hb += n
        ht += cached
        servers[d.prefill_node].serve(
            now, latency.prefill_s(r.input_len - cached, cached), r.input_len
        )
        pool.insert(d.prefill_node, r.blocks)
    pool.check_integrity()
    busy = {k: s.busy_s for k, s in servers.items()}
    return RouteResult(HitStats(hb, tb, ht, tt), busy, rejected, local)
