"""kvstore's policy: route by predicted TTFT (queue + prefix load + uncached prefill).

For every prefill-capable node whose paired decode side fits the request:
TTFT = queue wait + load of the cached prefix (its tiers' bandwidth; a donor's
prefix at network speed in pooled mode) + prefill of the rest. The minimum wins,
unless that node's queue is over (1 + slack) x the mean and another node is
within the margin: then the best of those (keeps max/mean load near 1 + slack).
A node holding a replica of a hot prefix is just another match, so replicas take
load off the overloaded holder.

`conditional=True` (policy "conditional") adds Dynamo's per-request choice:
prefill locally on the chosen decode node when that is predicted sooner than
remote prefill plus moving the KV, and the stall it causes to the node's running
streams stays within `max_local_stall_s`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvstore.conductor.api import ClusterView, Decision, NodeState, PrefixMatch, Request, Role
from kvstore.conductor.base import PolicyBase
from kvstore.conductor.errors import RejectedError
from kvstore.conductor.estimate import DecodeEstimate, PrefillEstimate
from kvstore.errors import BadRequestError


@dataclass(frozen=True, slots=True)
class CacheLoadConfig:
    """Knobs of cache_load: balance guard and the local-prefill limits."""

    slack: float = 0.25  # a node is overloaded past (1 + slack) x mean queue wait
    margin_rel: float = 0.1  # an alternative may be this much slower (relative) ...
    margin_s: float = 0.0  # ... plus this many seconds
    conditional: bool = False
    max_local_stall_s: float = 0.5  # longest prefill a busy decode node may run locally
    tie_s: float = 0.001  # TTFTs within tie_s or tie_rel of the lowest are a tie, ...
    tie_rel: float = 0.05  # ... broken in rotating node order so idle nodes share work

    def __post_init__(self) -> None:
        knobs = (self.slack, self.margin_rel, self.margin_s, self.max_local_stall_s)
        if min(*knobs, self.tie_s, self.tie_rel) < 0:
            raise BadRequestError(f"cache_load knobs must be >= 0: {self}")


@dataclass(frozen=True, slots=True)
class _Candidate:
    node: NodeState
    pre: PrefillEstimate
    dec: DecodeEstimate


class CacheLoadPolicy(PolicyBase):
    """Cache- and load-aware placement with admission control on by default."""

    name = "cache_load"

    def __init__(self, *, config: CacheLoadConfig | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("admission", True)
        super().__init__(**kwargs)
        self.config = config if config is not None else CacheLoadConfig()
        self._turn = 0  # rotates the tie-break so that idle nodes share the work

    def place(self, req: Request, view: ClusterView) -> Decision:
        matches = view.matches(req.block_hashes)
        prefill_nodes = view.prefill_nodes()
        cands = self._candidates(req, view, prefill_nodes, matches)
        best = self._balanced(cands, prefill_nodes)
        reason = f"{self.name}: min TTFT on {best.node.node_id}"
        if self.config.conditional and best.node.role != Role.COLOCATED:
            local = self._local_option(req, view, best, matches)
            if local is not None:
                return self.decide(req, local, best.dec, f"{self.name}: local prefill is sooner")
            reason = f"{self.name}: remote prefill on {best.node.node_id}"
        return self.decide(req, best.pre, best.dec, reason)

    def _candidates(
        self,
        req: Request,
        view: ClusterView,
        nodes: tuple[NodeState, ...],
        matches: dict[str, PrefixMatch],
    ) -> list[_Candidate]:
        """Every prefill node with its TTFT and decode pairing; raises when no KV fits."""
        cands: list[_Candidate] = []
        error: RejectedError | None = None
        for node in nodes:
            try:
                dec = self.decode_for(req, view, node)
            except RejectedError as exc:  # this pairing has no KV space
                error = exc
                continue
            cands.append(_Candidate(node, self.est.prefill_on(req, node, matches, view), dec))
        if not cands:
            assert error is not None
            raise error
        return cands

    def _balanced(self, cands: list[_Candidate], nodes: tuple[NodeState, ...]) -> _Candidate:
        """Min TTFT, unless that node is overloaded and a near-as-fast one is not."""
        pos = {n.node_id: i for i, n in enumerate(nodes)}
        turn = self._turn
        self._turn += 1
        best = self._min_ttft(cands, pos, turn)
        limit = (1 + self.config.slack) * sum(n.est_queue_wait_s for n in nodes) / len(nodes)
        if best.node.est_queue_wait_s <= limit:
            return best
        bound = best.pre.ttft_s * (1 + self.config.margin_rel) + self.config.margin_s
        ok = [c for c in cands if c.node.est_queue_wait_s <= limit and c.pre.ttft_s <= bound]
        return self._min_ttft(ok, pos, turn) if ok else best

    def _min_ttft(self, cands: list[_Candidate], pos: dict[str, int], turn: int) -> _Candidate:
        """The lowest TTFT; near-ties go to the first node at or after position `turn`
        in cluster order, so that idle nodes take turns."""
        low = min(c.pre.ttft_s for c in cands)
        tie = max(self.config.tie_s, self.config.tie_rel * low)
        near = [c for c in cands if c.pre.ttft_s <= low + tie]
        return min(near, key=lambda c: (pos[c.node.node_id] - turn) % len(pos))

    def _local_option(
        self, req: Request, view: ClusterView, best: _Candidate, matches: dict[str, PrefixMatch]
    ) -> PrefillEstimate | None:
        """Prefill on the decode node when sooner than remote prefill + KV move and the
        stall to its running streams is acceptable; None otherwise."""
        dnode = view.node(best.dec.node_id)
        local = self.est.prefill_on(req, dnode, matches, view)
        stall_ok = dnode.running_decode_seqs == 0 or local.floor_s <= self.config.max_local_stall_s
        remote_s = best.pre.ttft_s + self.est.kv_move_s(req)
        return local if stall_ok and local.ttft_s <= remote_s else None


class ConditionalPolicy(CacheLoadPolicy):
    """cache_load with the per-request remote-or-local prefill choice switched on."""

    name = "conditional"

    def __init__(self, *, config: CacheLoadConfig | None = None, **kwargs: Any) -> None:
        base = config if config is not None else CacheLoadConfig()
        super().__init__(config=replace(base, conditional=True), **kwargs)
