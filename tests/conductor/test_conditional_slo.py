"""Conditional placement with a TTFT objective: decode nodes prefill only to rescue a
request that remote prefill would make miss its objective (models in helpers.py:
prefill 0.1 ms per token, decode step 10 ms + 1 ms per sequence)."""

from __future__ import annotations

import pytest

from kvstore.conductor.api import Role
from kvstore.conductor.cache_load import CacheLoadConfig
from kvstore.conductor.registry import make_policy
from kvstore.errors import BadRequestError
from tests.conductor.helpers import KW, node, req, view

P, D = Role.PREFILL, Role.DECODE


def place(nodes: list, prompt: int, **slo: float):  # type: ignore[no-untyped-def]
    pol = make_policy("conditional", admission=False, **KW)
    d = pol.place(req(prompt, **slo), view(nodes))
    return d.prefill_node, d.decode_node, d.local_prefill


def test_remote_prefill_when_it_meets_the_objective_though_local_is_sooner() -> None:
    nodes = [node("p1", P, wait=0.05), node("d1", D, running=4)]
    # remote: 0.05 + 0.02 = 0.07 s <= 0.2 s: the decode node keeps decoding
    assert place(nodes, 200, ttft=0.2) == ("p1", "d1", False)
    # without an objective the sooner local prefill wins (0.02 s < 0.07 s + KV move)
    assert place(nodes, 200) == ("d1", "d1", True)


def test_idle_decode_node_prefills_only_to_rescue() -> None:
    # streams placed on d1 may still be on their way: it prefills only when remote misses
    nodes = [node("p1", P, wait=0.05), node("d1", D)]
    assert place(nodes, 200, ttft=0.2) == ("p1", "d1", False)
    assert place(nodes, 200, ttft=0.05) == ("d1", "d1", True)


def test_local_prefill_rescues_a_request_on_any_decode_node() -> None:
    # remote: 2.0 + 0.02 s misses 0.5 s. d1 (lowest pressure, 15 ms steps) is busy for 1 s
    # with a local prefill: 1.02 s misses too; d2 (31 ms steps) meets it in 0.02 s.
    nodes = [node("p1", P, wait=2.0), node("d1", D, wait=1.0, running=4),
             node("d2", D, running=20)]  # fmt: skip
    assert place(nodes, 200, ttft=0.5) == ("d2", "d2", True)
    assert place(nodes[:2], 200, ttft=0.5) == ("p1", "d1", False)  # no rescue: remote


def test_no_rescue_for_a_hopeless_request_or_an_unaffordable_stall() -> None:
    nodes = [node("p1", P, wait=2.0), node("d1", D, running=4)]
    assert place(nodes, 200, ttft=0.01) == ("p1", "d1", False)  # 0.02 s locally: misses too
    # 6000 tokens: 0.6 s stall > max_local_stall_s 0.5 s on a node running streams
    assert place(nodes, 6000, ttft=1.0) == ("p1", "d1", False)


def test_rescue_share_budget_is_the_tbt_objective() -> None:
    pol = make_policy("conditional", admission=False, **KW)
    v = view([node("p1", P, wait=2.0), node("d1", D, running=4)])
    # step 15 ms, TBT objective 20 ms: share may reach 1 - 15/20 = 0.25; each 2000-token
    # prefill (0.2 s) adds 0.2 / 5 s = 0.04: 6 rescues fit at t = 0, the 7th goes remote
    got = [pol.place(req(2000, rid=str(i), ttft=1.0, tbt=0.02), v).local_prefill for i in range(7)]
    assert got == [True] * 6 + [False]


def test_rescue_fill_is_validated() -> None:
    with pytest.raises(BadRequestError, match="rescue_tbt_fill"):
        CacheLoadConfig(rescue_tbt_fill=1.5)
