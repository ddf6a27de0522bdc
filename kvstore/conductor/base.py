"""What every placement policy shares: the estimator, decode pairing and the decision.

A subclass picks the prefill node (`pick_prefill`) and a decode node among those
where the request's KV fits (`pick_decode`). A COLOCATED prefill node decodes
the request itself; a PREFILL node hands it to a DECODE node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from kvstore.conductor import admission
from kvstore.conductor.api import ClusterView, Decision, NodeState, PrefixMatch, Request, Role
from kvstore.conductor.estimate import DecodeEstimate, Estimator, PrefillEstimate
from kvstore.conductor.latency import LatencyModel, TransferModel
from kvstore.conductor.profiles import load_profile
from kvstore.errors import BadRequestError


class PolicyBase:
    """Shared machinery; `admission=True` rejects requests that would miss their objectives."""

    name: ClassVar[str] = "base"

    def __init__(
        self,
        *,
        latency: LatencyModel | None = None,
        transfer: TransferModel | None = None,
        admission: bool = False,
        tbt_budget_s: float = 0.1,
        latencies: Mapping[str, LatencyModel] | None = None,
    ) -> None:
        if tbt_budget_s <= 0:
            raise BadRequestError(f"tbt_budget_s must be > 0, got {tbt_budget_s}")
        if latency is None or transfer is None:
            profile = load_profile()
            latency = latency if latency is not None else profile.latency
            transfer = transfer if transfer is not None else profile.transfer
        self.est = Estimator(latency, transfer, latencies)
        self.admission = admission
        self.tbt_budget_s = tbt_budget_s

    def place(self, req: Request, view: ClusterView) -> Decision:
        matches = view.matches(req.block_hashes)
        node = self.pick_prefill(req, serving_prefill_nodes(req, view), matches)
        pre = self.est.prefill_on(req, node, matches, view)
        dec = self.decode_for(req, view, node)
        return self.decide(req, pre, dec, f"{self.name}: prefill on {node.node_id}")

    def pick_prefill(
        self, req: Request, nodes: Sequence[NodeState], matches: dict[str, PrefixMatch]
    ) -> NodeState:
        raise NotImplementedError

    def pick_decode(self, req: Request, fitting: Sequence[DecodeEstimate]) -> DecodeEstimate:
        """Default: lowest pressure (TBT vs budget, KV used), as cache_load does."""
        choice = admission.pick_decode(fitting, self.tbt_budget_s)
        assert choice is not None  # callers pass a non-empty list of fitting nodes
        return choice

    def decode_for(self, req: Request, view: ClusterView, prefill: NodeState) -> DecodeEstimate:
        """The decode side for a prefill on `prefill`. When the KV fits nowhere: RejectedError
        with admission on, else the node with the most free KV (the request waits there)."""
        nodes = [n for n in self.decode_candidates(view, prefill) if n.serves(req)]
        if not nodes:
            raise too_long(req, view)
        estimates = [self.est.decode_on(req, n) for n in nodes]
        fitting = [e for e in estimates if e.fits]
        if fitting:
            return self.pick_decode(req, fitting)
        if self.admission:
            raise admission.no_decode_space(req, estimates)
        return min(estimates, key=lambda e: (-e.kv_free_after, e.node_id))

    def decode_candidates(self, view: ClusterView, prefill: NodeState) -> tuple[NodeState, ...]:
        """A COLOCATED node decodes its own prefills; otherwise DECODE nodes (else any)."""
        if prefill.role == Role.COLOCATED:
            return (prefill,)
        dedicated = tuple(n for n in view.nodes if n.role == Role.DECODE)
        return dedicated or view.decode_nodes()

    def decide(
        self, req: Request, pre: PrefillEstimate, dec: DecodeEstimate, reason: str
    ) -> Decision:
        """Apply admission (when on) and build the decision."""
        if self.admission:
            admission.check_ttft(req, pre.ttft_s, pre.floor_s)
            admission.check_tbt(req, dec)
        return Decision(
            prefill_node=pre.node_id,
            decode_node=dec.node_id,
            local_prefill=pre.node_id == dec.node_id,
            cached_blocks=pre.cached_blocks,
            predicted_ttft_s=pre.ttft_s,
            predicted_tbt_s=dec.tbt_s,
            reason=reason,
            source_node=pre.source_node,
        )


def serving_prefill_nodes(req: Request, view: ClusterView) -> tuple[NodeState, ...]:
    """The prefill-capable nodes whose model context holds the request; BadRequestError
    (too long for every node) when there is none."""
    nodes = tuple(n for n in view.prefill_nodes() if n.serves(req))
    if not nodes:
        raise too_long(req, view)
    return nodes


def too_long(req: Request, view: ClusterView) -> BadRequestError:
    """The error for a request longer than any node's context."""
    longest = max((n.max_context_tokens or 0) for n in view.nodes)
    return BadRequestError(
        f"request {req.request_id}: {req.prompt_tokens + req.output_tokens} tokens exceed "
        f"every node's context (longest {longest})"
    )
