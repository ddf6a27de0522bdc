"""Role-flexible placement: per request, remote prefill + decode, prefill on the decode node,
or both phases on one colocated node, chosen by predicted TTFT and TBT against the objectives.

Every node may take either role (as Dynamo's and llm-d's schedulers let a worker do): a
PREFILL node prefills for any decode node; a DECODE node prefills prompts within its
local-prefill limit for itself; a COLOCATED node does both, and in the simulator (where
`hands_off` is true) also prefills for another node's decode. The options, for one request:

- remote: prefill on node p, decode on the decode node d* of lowest pressure (its step
  time stretched by the share of its time that its own prefills take, `conditional.py`);
- local: prefill and decode on one decode-capable node d (a DECODE node within its
  limit, or a COLOCATED node).

Each option gets a predicted TTFT (queue + prefix load + compute), a predicted TBT (the
decode node's step with this request, stretched by its prefill share, this prefill's
included when it runs there) and a harm check: a prefill on a node that is decoding
stalls its streams, so it must keep their mean time between tokens, stretched by the
node's prefill share, within `local_tbt_fill` of the objective (`conditional.py`).
An option *meets* the request when its TTFT is within `ttft_fill` of the TTFT objective,
its TBT within the TBT objective (else the policy's budget) and it harms no stream.

Among the options that meet the request, those on PREFILL nodes come first (decode
time is spent on a prefill only when that saves the request), then the lowest TTFT with
cache_load's balance guard; on the chosen node a local option (no KV move) comes before
a remote one. With no TTFT objective the soonest
first token wins among those that meet the TBT objective. When nothing meets the
request: the lowest TTFT among the options that meet TBT and harm none, else the lowest
TTFT. Admission (when on) then rejects what would miss its objectives anyway.

The gRPC conductor and the simulator run this same code; the node limits it reads
(`local_prefill_tokens`, `hands_off`, `max_context_tokens`) are fields of `NodeState`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvstore.conductor import admission
from kvstore.conductor.api import ClusterView, Decision, NodeState, PrefixMatch, Request
from kvstore.conductor.base import serving_prefill_nodes, too_long
from kvstore.conductor.cache_load import CacheLoadConfig, CacheLoadPolicy, Candidate
from kvstore.conductor.conditional import stretched_tbt_s
from kvstore.conductor.estimate import DecodeEstimate, PrefillEstimate
from kvstore.errors import BadRequestError


@dataclass(frozen=True, slots=True)
class _Option:
    """One way to serve a request: prefill on `node`, decode per `dec`."""

    kind: str  # "remote" or "local"
    node: NodeState
    pre: PrefillEstimate
    dec: DecodeEstimate
    tbt_s: float  # predicted time between tokens (stretched by prefill share)
    harmless: bool  # the prefill keeps the node's streams within their share budget

    @property
    def local(self) -> bool:
        return self.kind == "local"


class FlexiblePolicy(CacheLoadPolicy):
    """Per-request choice among remote, local and colocated serving (see module doc)."""

    name = "flexible"

    def __init__(
        self, *, config: CacheLoadConfig | None = None, ttft_fill: float = 0.8, **kwargs: Any
    ) -> None:
        if not 0 < ttft_fill <= 1:
            raise BadRequestError(f"ttft_fill must be in (0, 1], got {ttft_fill}")
        # the share window spans a stream's life (hundreds of tokens), not one prefill
        base = config if config is not None else CacheLoadConfig(local_window_s=30.0)
        kwargs.setdefault("admission", False)
        super().__init__(config=replace(base, conditional=True), **kwargs)
        self.ttft_fill = ttft_fill

    def place(self, req: Request, view: ClusterView) -> Decision:
        matches = view.matches(req.block_hashes)
        options = self._options(req, view, matches)
        choice = self._choose(req, options, view)
        why = f"{choice.kind} prefill"
        return self._commit(req, choice.node, choice.pre, choice.dec, why)

    # -- the options -----------------------------------------------------------------

    def _options(
        self, req: Request, view: ClusterView, matches: dict[str, PrefixMatch]
    ) -> list[_Option]:
        decoders = [n for n in view.decode_nodes() if n.serves(req)]
        if not decoders:
            raise too_long(req, view)
        decs = {n.node_id: self.est.decode_on(req, n) for n in decoders}
        fitting = [e for e in decs.values() if e.fits]
        if not fitting:
            if self.admission:
                raise admission.no_decode_space(req, list(decs.values()))
            fitting = [min(decs.values(), key=lambda e: (-e.kv_free_after, e.node_id))]
        target = self.pick_decode(req, fitting)  # d*: where a remote prefill hands off
        pres: dict[str, PrefillEstimate] = {}

        def pre(node: NodeState) -> PrefillEstimate:
            if node.node_id not in pres:
                pres[node.node_id] = self.est.prefill_on(req, node, matches, view)
            return pres[node.node_id]

        out: list[_Option] = []
        for node in self._remote_prefillers(req, view, target.node_id):
            out.append(self._option("remote", node, pre(node), target, req))
        for node in decoders:
            dec = decs[node.node_id]
            if dec.fits and node.can_prefill_locally(req):
                out.append(self._option("local", node, pre(node), dec, req))
        if not out:  # e.g. the only fitting decoder may not prefill this prompt itself
            raise BadRequestError(
                f"request {req.request_id}: no node can prefill it for a decode node "
                "(no PREFILL node, and no decode node within its local-prefill limit)"
            )
        return out

    @staticmethod
    def _remote_prefillers(req: Request, view: ClusterView, target: str) -> tuple[NodeState, ...]:
        """Nodes that may prefill for another node's decode: PREFILL nodes, and COLOCATED
        ones that hand off (none when no node serves the request)."""
        try:
            nodes = serving_prefill_nodes(req, view)
        except BadRequestError:
            return ()
        return tuple(n for n in nodes if n.node_id != target and (n.hands_off or not n.can_decode))

    def _option(
        self, kind: str, node: NodeState, pre: PrefillEstimate, dec: DecodeEstimate, req: Request
    ) -> _Option:
        # this request's own prefill runs before its decode: only the others' stretch it
        tbt = stretched_tbt_s(dec.tbt_s, self._share.share(dec.node_id, req.arrival_s))
        return _Option(kind, node, pre, dec, tbt, self._harmless(req, node, pre))

    def _harmless(self, req: Request, node: NodeState, pre: PrefillEstimate) -> bool:
        """A prefill on a decoding node must keep its streams' mean time between tokens,
        stretched by the node's prefill share, within the share budget. (No limit on one
        stall: the objective is on the mean over a stream's tokens.)"""
        if not node.can_decode or not node.running_decode_seqs:
            return True
        return self._share_ok(req, node, pre)

    # -- the choice ------------------------------------------------------------------

    def _meets(self, req: Request, o: _Option) -> bool:
        tbt_slo = req.tbt_slo_s or self.tbt_budget_s
        ttft_ok = req.ttft_slo_s is None or o.pre.ttft_s <= req.ttft_slo_s * self.ttft_fill
        return ttft_ok and o.tbt_s <= tbt_slo and o.harmless

    def _choose(self, req: Request, options: list[_Option], view: ClusterView) -> _Option:
        meeting = [o for o in options if self._meets(req, o)]
        if not meeting:
            tbt_slo = req.tbt_slo_s or self.tbt_budget_s
            safe = [o for o in options if o.harmless and o.tbt_s <= tbt_slo]
            return min(safe or options, key=lambda o: (o.pre.ttft_s, not o.local, o.node.node_id))
        if req.ttft_slo_s is None:  # soonest first token (a remote one pays the KV move)
            move = self.est.kv_move_s(req)
            return min(
                meeting,
                key=lambda o: (o.pre.ttft_s + (0 if o.local else move), o.node.node_id),
            )
        # decode time is spent only when no PREFILL node meets the request
        dedicated = [o for o in meeting if not o.node.can_decode]
        return self._balanced_option(dedicated or meeting, view)

    def _balanced_option(self, cheap: list[_Option], view: ClusterView) -> _Option:
        """cache_load's min-TTFT choice with its balance guard; on the chosen node a local
        option (no KV move) before a remote one."""
        by_node: dict[str, _Option] = {}
        for o in sorted(cheap, key=lambda o: not o.local):
            by_node.setdefault(o.node.node_id, o)
        cands = [Candidate(o.node, o.pre, o.dec) for o in by_node.values()]
        best = self._balanced(cands, tuple(o.node for o in by_node.values()))
        return by_node[best.node.node_id]
