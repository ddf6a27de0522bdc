"""Role-flexible placement on hand-computed clusters (models in helpers.py: prefill 0.1 ms
per token, decode step 10 ms + 1 ms per sequence), and the node limits every policy reads
from NodeState (local-prefill limit, hands_off, context, latency profile)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvstore.conductor.api import NodeState, Role
from kvstore.conductor.latency import QuadraticLatencyModel
from kvstore.conductor.registry import make_policy
from kvstore.errors import BadRequestError, NotFoundError
from tests.conductor.helpers import KW, node, req, view

P, D, C = Role.PREFILL, Role.DECODE, Role.COLOCATED


def place(name: str, nodes: list[NodeState], prompt: int, **slo: float) -> tuple[str, str, bool]:
    pol = make_policy(name, admission=False, **KW)
    d = pol.place(req(prompt, **slo), view(nodes))
    assert d.local_prefill == (d.prefill_node == d.decode_node)
    return d.prefill_node, d.decode_node, d.local_prefill


@pytest.mark.parametrize("name", ["flexible", "conditional"])
def test_the_policy_applies_the_decode_nodes_local_prefill_limit(name: str) -> None:
    # remote: 2.0 + 0.02 s misses the 0.5 s objective; a local prefill on d1 meets it,
    # but only within d1's limit (the rule the gRPC service used to apply on its own)
    busy = node("p1", P, wait=2.0)
    d1 = node("d1", D, running=4)
    assert place(name, [busy, d1], 200, ttft=0.5) == ("d1", "d1", True)
    limited = replace(d1, local_prefill_tokens=100)
    assert place(name, [busy, limited], 200, ttft=0.5) == ("p1", "d1", False)
    assert place(name, [busy, limited], 100, ttft=0.5) == ("d1", "d1", True)
    assert place(name, [busy, replace(d1, local_prefill_tokens=0)], 100, ttft=0.5)[2] is False


def test_flexible_spends_decode_time_only_when_it_saves_the_request() -> None:
    nodes = [node("p1", P, wait=0.05), node("d1", D, running=4)]
    # remote meets the objective (0.07 s <= 0.8 x 0.5 s): the decode node keeps decoding
    assert place("flexible", nodes, 200, ttft=0.5) == ("p1", "d1", False)
    # no TTFT objective: the soonest first token (local 0.02 s < 0.07 s + KV move)
    assert place("flexible", nodes, 200) == ("d1", "d1", True)


def test_colocated_nodes_take_either_role_unless_they_cannot_hand_off() -> None:
    # n2 is idle but its KV is full: it can only prefill for n1 (1 s queue)
    n1, n2 = node("n1", C, wait=1.0), node("n2", C, free=0)
    assert place("flexible", [n1, n2], 200, ttft=0.5) == ("n2", "n1", False)
    # a gRPC colocated node has no Prefill RPC (hands_off False): n1 serves it whole
    grpc_like = [replace(n1, hands_off=False), replace(n2, hands_off=False)]
    assert place("flexible", grpc_like, 200, ttft=0.5) == ("n1", "n1", True)
    pre, dec, _ = place("conditional", grpc_like, 200, ttft=0.5)
    assert pre == dec  # conditional pairs such a node with itself (here: it waits for KV)


def test_requests_longer_than_every_context_are_refused() -> None:
    short = [
        replace(node("p1", P), max_context_tokens=150),
        replace(node("d1", D), max_context_tokens=150),
    ]
    for name in ("flexible", "cache_load", "round_robin"):
        with pytest.raises(BadRequestError, match="exceed every node's context"):
            place(name, short, 200)
    # a node whose context holds it serves it; the short one is left out
    mixed = [short[0], node("p2", P, wait=5.0), node("d1", D)]
    assert place("cache_load", mixed, 200)[0] == "p2"


def test_each_node_runs_its_own_latency_profile() -> None:
    fast = QuadraticLatencyModel("fast", prefill_ms=(0.0, 0.01, 0.0), decode_ms=(1.0, 0.0, 0.1))
    nodes = [replace(node("p1", P, wait=0.01), profile="fast"), node("p2", P), node("d1", D)]
    pol = make_policy("flexible", latencies={"fast": fast}, **KW)
    d = pol.place(req(2000), view(nodes))
    # p1: 0.01 + 2000 x 0.01 ms = 0.03 s; p2: 2000 x 0.1 ms = 0.2 s
    assert (d.prefill_node, d.predicted_ttft_s) == ("p1", pytest.approx(0.03))
    with pytest.raises(NotFoundError, match=r"profile 'tpu' \(known: fast\)"):
        pol.place(req(2000), view([replace(node("p1", P), profile="tpu"), node("d1", D)]))


def test_flexible_knobs_are_validated() -> None:
    with pytest.raises(BadRequestError, match="ttft_fill"):
        make_policy("flexible", ttft_fill=0.0, **KW)
    with pytest.raises(BadRequestError, match="negative token limits"):
        replace(node("d1", D), local_prefill_tokens=-1)
