"""Simulated serving nodes: one GPU loop per node, driven by the shared event loop.

Each node's GPU runs either a prefill (FIFO, prefill first, so a long prompt stalls the
node's running decodes, as on a colocated vLLM engine) or one continuous-batching decode step
of all its running sequences. Step times come from a `LatencyModel`; loading a cached prefix
(by tier, remote at network speed) and the prefill->decode KV move from a `TransferModel`.
A prefill uses the longest prefix its node can reach in the `pool` (its own cache, or any
node's in a pooled store) and then stores the prompt's blocks there. A sequence reserves
prompt+output tokens of its decode node's KV memory and waits FIFO when they do not fit.

Nodes may differ (heterogeneous pools): a node's `profile` names its latency model in the
cluster's `latencies` (e.g. H100 prefill nodes and A100 decode nodes), and a node's role can
change while the cluster runs (`set_role`: new work follows the new role, work already
there finishes). Each job records its TTFT in parts: queue, prefix load (from the node's
own tiers and from the pool's other nodes, by tier) and compute.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kvstore.conductor.api import NodeState, Role
from kvstore.conductor.latency import LatencyModel, TransferModel
from kvstore.errors import BadRequestError
from kvstore.sim.cache import TierCapacity, hit_tokens
from kvstore.sim.events import EventLoop
from kvstore.sim.pool import make_pool
from kvstore.sim.traces import BLOCK_TOKENS, TraceRequest
from kvstore.types import Tier


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One simulated node: its role, prefix-cache capacity per tier, decode KV memory."""

    node_id: str
    role: Role
    cache: TierCapacity
    kv_capacity_tokens: int
    profile: str = ""  # latency profile name in the cluster's `latencies` ("" = default)
    max_context_tokens: int | None = None  # the model's context limit (None: none)
    local_prefill_tokens: int | None = None  # DECODE: longest prompt it prefills itself

    def __post_init__(self) -> None:
        if not self.node_id or self.kv_capacity_tokens <= 0:
            raise BadRequestError(f"node spec needs an id and kv_capacity_tokens > 0: {self}")
        limits = (self.max_context_tokens, self.local_prefill_tokens)
        if any(x is not None and x < 0 for x in limits):
            raise BadRequestError(f"node spec {self.node_id}: negative token limits")


def uniform_nodes(
    n: int,
    role: Role,
    cache: TierCapacity,
    kv_capacity_tokens: int,
    prefix: str = "n",
    profile: str = "",
    max_context_tokens: int | None = None,
) -> tuple[NodeSpec, ...]:
    """`n` identical nodes named prefix0..prefix{n-1}."""
    if n <= 0:
        raise BadRequestError(f"a cluster needs at least one node, got {n}")
    return tuple(
        NodeSpec(f"{prefix}{i}", role, cache, kv_capacity_tokens, profile, max_context_tokens)
        for i in range(n)
    )


@dataclass(slots=True)
class Job:
    """One request in flight; times are simulated seconds (None = not reached yet)."""

    req: TraceRequest
    prefill_node: str
    decode_node: str
    arrival_s: float
    first_token_s: float | None = None
    finish_s: float | None = None
    cached_blocks: int = 0
    generated: int = 0
    kv_tokens: int = 0
    predicted_s: float = 0.0
    queue_s: float = 0.0  # TTFT parts: waiting for the prefill node, ...
    load_s: dict[str, float] = field(default_factory=dict)  # ... loading the prefix, by
    compute_s: float = 0.0  # source ("local DRAM", "pooled SSD", ...), and computing

    @property
    def new_tokens(self) -> int:
        """Prompt tokens to compute: at least one, to produce the first token."""
        return max(self.req.input_len - hit_tokens(self.req, self.cached_blocks), 1)


@dataclass(slots=True)
class SimNode:
    """A node's queues and GPU state, driven by the shared event loop."""

    spec: NodeSpec
    role: Role = Role.COLOCATED  # set from the spec; `SimCluster.set_role` changes it
    prefill_q: deque[Job] = field(default_factory=deque)
    mem_wait: deque[Job] = field(default_factory=deque)
    running: list[Job] = field(default_factory=list)
    busy_until: float = 0.0
    busy: bool = False
    kv_used: int = 0
    busy_s: float = 0.0
    prefill_tokens: int = 0

    def state(self, now: float, queued_s: float) -> NodeState:
        spec = self.spec
        cap = spec.kv_capacity_tokens
        return NodeState(
            node_id=spec.node_id,
            role=self.role,
            queued_prefill_tokens=sum(j.req.input_len for j in self.prefill_q),
            running_decode_seqs=len(self.running) + len(self.mem_wait),
            decode_context_tokens=sum(j.kv_tokens for j in self.running),
            kv_free_tokens=max(cap - self.kv_used, 0),
            kv_capacity_tokens=cap,
            est_queue_wait_s=max(self.busy_until - now, 0.0) + queued_s,
            profile=spec.profile,
            local_prefill_tokens=spec.local_prefill_tokens,
            max_context_tokens=spec.max_context_tokens,
        )


class SimCluster:
    """Nodes plus the event loop that drives them; `submit` starts a placed request."""

    def __init__(
        self,
        specs: Sequence[NodeSpec],
        latency: LatencyModel,
        transfer: TransferModel,
        *,
        pooled: bool,
        on_done: Callable[[Job], None] | None = None,
        latencies: Mapping[str, LatencyModel] | None = None,
    ) -> None:
        if not specs:
            raise BadRequestError("empty cluster: no node specs")
        self.loop = EventLoop()
        self.latency = latency
        self.latencies = dict(latencies or {})
        missing = sorted({s.profile for s in specs if s.profile} - set(self.latencies))
        if missing:
            known = ", ".join(sorted(self.latencies)) or "none"
            raise BadRequestError(f"no latency model for profiles {missing} (given: {known})")
        self.transfer = transfer
        self.pooled = pooled
        self.on_done = on_done
        self.nodes = {s.node_id: SimNode(s, s.role) for s in specs}
        if len(self.nodes) != len(specs):
            raise BadRequestError("duplicate node ids in cluster specs")
        self.pool = make_pool({s.node_id: s.cache for s in specs}, pooled=pooled)
        self.role_changes: list[tuple[float, str, Role]] = []

    def latency_of(self, node: SimNode) -> LatencyModel:
        return self.latencies[node.spec.profile] if node.spec.profile else self.latency

    def set_role(self, node_id: str, role: Role) -> None:
        """Give `node_id` a new role from now on; its queued and running work finishes."""
        node = self.nodes.get(node_id)
        if node is None:
            raise BadRequestError(f"unknown node {node_id!r}")
        if node.role != role:
            node.role = role
            self.role_changes.append((self.loop.now, node_id, role))

    def node_states(self) -> tuple[NodeState, ...]:
        now = self.loop.now
        return tuple(
            n.state(now, sum(j.predicted_s for j in n.prefill_q) + self.drain_s(n))
            for n in self.nodes.values()
        )

    def drain_s(self, node: SimNode) -> float:
        """A node flipped to PREFILL still decodes its streams, and a prefill there stalls
        them: policies see the longest one's remaining tokens at its current step time in
        its queue wait, so they prefill there only when that is still the better choice."""
        if node.role != Role.PREFILL or not node.running:
            return 0.0
        ctx = sum(j.kv_tokens for j in node.running)
        step = self.latency_of(node).decode_step_s(len(node.running), ctx)
        return max(j.req.output_len - j.generated for j in node.running) * step

    def submit(self, job: Job) -> None:
        """Queue `job`'s prefill on its prefill node (node ids must exist)."""
        if job.prefill_node not in self.nodes or job.decode_node not in self.nodes:
            raise BadRequestError(
                f"decision names unknown nodes: {job.prefill_node}, {job.decode_node}"
            )
        node = self.nodes[job.prefill_node]
        cached = hit_tokens(job.req, self.pool.prefix(node.spec.node_id, job.req.blocks).blocks)
        lat = self.latency_of(node)
        job.predicted_s = lat.prefill_s(max(job.req.input_len - cached, 1), cached)
        node.prefill_q.append(job)
        self._kick(node)

    def _kick(self, node: SimNode) -> None:
        if not node.busy:
            node.busy = True
            self.loop.after(0.0, lambda: self._step(node))

    def _step(self, node: SimNode) -> None:
        if node.prefill_q:
            job = node.prefill_q.popleft()
            dur = self._start_prefill(node, job)
            node.busy_until = self.loop.now + dur
            node.busy_s += dur
            self.loop.after(dur, lambda: self._end_prefill(node, job))
        elif node.running:
            ctx = sum(j.kv_tokens for j in node.running)
            dur = self.latency_of(node).decode_step_s(len(node.running), ctx)
            node.busy_until = self.loop.now + dur
            node.busy_s += dur
            self.loop.after(dur, lambda: self._end_decode_step(node))
        else:
            node.busy = False

    def _start_prefill(self, node: SimNode, job: Job) -> float:
        hit = self.pool.prefix(node.spec.node_id, job.req.blocks)
        job.cached_blocks = hit.blocks
        job.queue_s = self.loop.now - job.arrival_s
        job.load_s = self._load_parts(hit.local, hit.remote)
        node.prefill_tokens += job.new_tokens
        cached = job.req.input_len - job.new_tokens
        job.compute_s = self.latency_of(node).prefill_s(job.new_tokens, cached)
        return sum(job.load_s.values()) + job.compute_s

    def _load_parts(self, local: dict[Tier, int], remote: dict[Tier, int]) -> dict[str, float]:
        """Seconds to load a prefix, by source and tier; the per-load overhead goes to the
        pooled part when anything comes from another node, else to the local part."""
        tr = self.transfer
        parts: dict[str, float] = {}
        for where, blocks, far in (("local", local, False), ("pooled", remote, True)):
            for tier, n in blocks.items():
                if n:
                    per = BLOCK_TOKENS * tr.kv_bytes_per_token / tr.bandwidth(tier, far)
                    parts[f"{where} {tier.name}"] = n * per
        if parts:
            key = next((k for k in parts if k.startswith("pooled")), next(iter(parts)))
            parts[key] += tr.overhead_s
        return parts

    def _end_prefill(self, node: SimNode, job: Job) -> None:
        job.first_token_s = self.loop.now
        self.pool.insert(node.spec.node_id, job.req.blocks)
        job.kv_tokens = job.req.input_len
        job.generated = 1
        if job.req.output_len <= 1:
            self._finish(job)
        elif job.decode_node == node.spec.node_id:
            self._admit(node, job)
        else:
            dest = self.nodes[job.decode_node]
            move = job.req.input_len * self.transfer.kv_bytes_per_token
            self.loop.after(
                move / self.transfer.network_bytes_per_s, lambda: self._admit(dest, job)
            )
        self._step(node)

    def _admit(self, node: SimNode, job: Job) -> None:
        node.mem_wait.append(job)
        self._drain_mem_wait(node)
        self._kick(node)

    def _drain_mem_wait(self, node: SimNode) -> None:
        cap = node.spec.kv_capacity_tokens
        while node.mem_wait:
            job = node.mem_wait[0]
            need = job.req.input_len + job.req.output_len
            if node.running and node.kv_used + need > cap:
                return
            node.mem_wait.popleft()
            node.kv_used += need
            node.running.append(job)

    def _end_decode_step(self, node: SimNode) -> None:
        still = []
        for job in node.running:
            job.generated += 1
            job.kv_tokens += 1
            if job.generated >= job.req.output_len:
                node.kv_used -= job.req.input_len + job.req.output_len
                self._finish(job)
            else:
                still.append(job)
        node.running = still
        self._drain_mem_wait(node)
        self._step(node)

    def _finish(self, job: Job) -> None:
        job.finish_s = self.loop.now
        if self.on_done is not None:
            self.on_done(job)

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        for node in self.nodes.values():
            used = sum(j.req.input_len + j.req.output_len for j in node.running)
            if used != node.kv_used:
                raise AssertionError(f"{node.spec.node_id}: kv_used {node.kv_used} != {used}")
