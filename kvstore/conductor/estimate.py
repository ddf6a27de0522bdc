"""Predictions shared by every policy: TTFT of a prefill on a node, TBT of a decode on a node.

TTFT on node n = n's queue wait + time to load the cached prefix (by the tier it
sits in; from another node at network speed in pooled mode) + prefill time of the
uncached part. TBT on node d = one decode step of d's batch with this request added.
Each node's compute comes from the latency model of its `profile` (heterogeneous
pools: an H100 prefill node and an A100 decode node), else the default model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvstore.conductor.api import (
    ClusterView,
    NodeState,
    PooledPrefixIndex,
    PrefixMatch,
    Request,
)
from kvstore.conductor.latency import LatencyModel, TransferModel
from kvstore.errors import NotFoundError
from kvstore.types import Tier


@dataclass(frozen=True, slots=True)
class PrefillEstimate:
    """A prefill of one request on `node_id`, loading `cached_blocks` from `source_node`."""

    node_id: str
    ttft_s: float  # queue wait + load + compute
    load_s: float
    compute_s: float
    cached_blocks: int
    cached_tokens: int
    source_node: str | None  # None when nothing is loaded

    @property
    def floor_s(self) -> float:
        """TTFT on an idle node: load + compute, no queue."""
        return self.load_s + self.compute_s


@dataclass(frozen=True, slots=True)
class DecodeEstimate:
    """A decode of one request on `node_id`: its step time and whether its KV fits."""

    node_id: str
    tbt_s: float
    idle_tbt_s: float  # step time alone on the node: the best any wait can give
    fits: bool
    kv_free_after: int
    kv_capacity: int
    running_seqs: int  # sequences decoding there before this one


class Estimator:
    """Evaluates prefill and decode options with one latency and one transfer model."""

    def __init__(
        self,
        latency: LatencyModel,
        transfer: TransferModel,
        latencies: Mapping[str, LatencyModel] | None = None,
    ) -> None:
        self.latency = latency
        self.transfer = transfer
        self.latencies = dict(latencies or {})

    def latency_of(self, node: NodeState) -> LatencyModel:
        """The latency model of `node`'s profile; the default when it names none.
        NotFoundError listing the known profiles for one the estimator was not given."""
        if not node.profile:
            return self.latency
        found = self.latencies.get(node.profile)
        if found is None:
            known = ", ".join(sorted(self.latencies)) or "none"
            raise NotFoundError(
                f"node {node.node_id}: no latency model for profile {node.profile!r} "
                f"(known: {known})"
            )
        return found

    def cached_tokens(self, req: Request, blocks: int, block_tokens: int) -> int:
        """Tokens a prefix of `blocks` saves; the last prompt token is always computed."""
        return max(0, min(blocks * block_tokens, req.prompt_tokens - 1))

    def prefill_on(
        self, req: Request, node: NodeState, matches: dict[str, PrefixMatch], view: ClusterView
    ) -> PrefillEstimate:
        """The fastest way to prefill `req` on `node`: its own prefix or (pooled) the pool's."""
        nid = node.node_id
        if view.pooled and isinstance(view.index, PooledPrefixIndex):
            split = view.index.prefix(nid, req.block_hashes)
            src = nid if not sum(split.remote.values()) else None
            return self._option(req, node, split.local, split.remote, view, src)
        best = self._option(req, node, matches[nid].tier_blocks, {}, view, nid)
        donor = _best_donor(nid, matches) if view.pooled else None
        if donor is not None and matches[donor].blocks > best.cached_blocks:
            alt = self._option(req, node, {}, matches[donor].tier_blocks, view, donor)
            if alt.ttft_s < best.ttft_s:
                best = alt
        return best

    def _option(
        self,
        req: Request,
        node: NodeState,
        local: Mapping[Tier, int],
        remote: Mapping[Tier, int],
        view: ClusterView,
        source: str | None,
    ) -> PrefillEstimate:
        """Prefill on `node` loading `local` blocks from its tiers and `remote` ones from others."""
        blocks = sum(local.values()) + sum(remote.values())
        cached = self.cached_tokens(req, blocks, view.block_tokens)
        scale = cached / blocks if blocks else 0.0  # tokens per block actually used
        load = self.transfer.load_split_s(
            {Tier(t): n * scale for t, n in local.items()},
            {Tier(t): n * scale for t, n in remote.items()},
        )
        compute = self.latency_of(node).prefill_s(req.prompt_tokens - cached, cached)
        return PrefillEstimate(
            node_id=node.node_id,
            ttft_s=node.est_queue_wait_s + load + compute,
            load_s=load,
            compute_s=compute,
            cached_blocks=blocks if cached else 0,
            cached_tokens=cached,
            source_node=source if cached else None,
        )

    def decode_on(self, req: Request, node: NodeState) -> DecodeEstimate:
        """Step time of `node`'s batch with `req` added, and whether `req`'s KV fits."""
        need = req.prompt_tokens + req.output_tokens
        ctx = node.decode_context_tokens + req.prompt_tokens
        lat = self.latency_of(node)
        return DecodeEstimate(
            node_id=node.node_id,
            tbt_s=lat.decode_step_s(node.running_decode_seqs + 1, ctx),
            idle_tbt_s=lat.decode_step_s(1, req.prompt_tokens),
            fits=node.kv_free_tokens >= need,
            kv_free_after=node.kv_free_tokens - need,
            kv_capacity=node.kv_capacity_tokens,
            running_seqs=node.running_decode_seqs,
        )

    def kv_move_s(self, req: Request) -> float:
        """Seconds to move the prompt's KV from a prefill node to a decode node."""
        nbytes = req.prompt_tokens * self.transfer.kv_bytes_per_token
        return self.transfer.overhead_s + nbytes / self.transfer.network_bytes_per_s


def _best_donor(node_id: str, matches: dict[str, PrefixMatch]) -> str | None:
    """The other node with the longest cached prefix (ties: faster tier, then id)."""
    others = [(m.blocks, -int(m.slowest_tier or 0), nid) for nid, m in matches.items()]
    others = [o for o in others if o[2] != node_id and o[0] > 0]
    if not others:
        return None
    return min(others, key=lambda o: (-o[0], -o[1], o[2]))[2]
