"""Baseline policies: round-robin, random, least-loaded and prefix-only routing."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from kvstore.conductor.api import NodeState, PrefixMatch, Request
from kvstore.conductor.base import PolicyBase
from kvstore.conductor.estimate import DecodeEstimate


class RoundRobinPolicy(PolicyBase):
    """Prefill nodes in turn; decode nodes (those where the KV fits) in turn."""

    name = "round_robin"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._next_prefill = 0
        self._next_decode = 0

    def pick_prefill(
        self, req: Request, nodes: Sequence[NodeState], matches: dict[str, PrefixMatch]
    ) -> NodeState:
        node = nodes[self._next_prefill % len(nodes)]
        self._next_prefill += 1
        return node

    def pick_decode(self, req: Request, fitting: Sequence[DecodeEstimate]) -> DecodeEstimate:
        choice = fitting[self._next_decode % len(fitting)]
        self._next_decode += 1
        return choice


class RandomPolicy(PolicyBase):
    """Uniformly random prefill and decode nodes (seeded, reproducible)."""

    name = "random"

    def __init__(self, *, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rng = random.Random(seed)

    def pick_prefill(
        self, req: Request, nodes: Sequence[NodeState], matches: dict[str, PrefixMatch]
    ) -> NodeState:
        return self._rng.choice(list(nodes))

    def pick_decode(self, req: Request, fitting: Sequence[DecodeEstimate]) -> DecodeEstimate:
        return self._rng.choice(list(fitting))


class LeastLoadedPolicy(PolicyBase):
    """Shortest prefill queue; decode node with the fewest running sequences."""

    name = "least_loaded"

    def pick_prefill(
        self, req: Request, nodes: Sequence[NodeState], matches: dict[str, PrefixMatch]
    ) -> NodeState:
        return min(nodes, key=lambda n: (n.est_queue_wait_s, n.queued_prefill_tokens, n.node_id))

    def pick_decode(self, req: Request, fitting: Sequence[DecodeEstimate]) -> DecodeEstimate:
        return min(fitting, key=lambda e: (e.running_seqs, -e.kv_free_after, e.node_id))


class PrefixOnlyPolicy(PolicyBase):
    """The node caching the longest prefix, load ignored (ties: shorter queue, then id);
    decode on the node with the shortest step time."""

    name = "prefix_only"

    def pick_prefill(
        self, req: Request, nodes: Sequence[NodeState], matches: dict[str, PrefixMatch]
    ) -> NodeState:
        return min(nodes, key=lambda n: (-matches[n.node_id].blocks, n.est_queue_wait_s, n.node_id))

    def pick_decode(self, req: Request, fitting: Sequence[DecodeEstimate]) -> DecodeEstimate:
        return min(fitting, key=lambda e: (e.tbt_s, -e.kv_free_after, e.node_id))
