"""Exact placements of every policy on small hand-made clusters."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kvstore.conductor import POLICIES, RejectedError, Role, make_policy
from kvstore.conductor.api import ClusterView, NodeState, Request
from kvstore.conductor.cache_load import CacheLoadConfig
from kvstore.conductor.conditional import PrefillShare, stretched_tbt_s
from kvstore.conductor.index import DictPrefixIndex, PooledDictIndex
from kvstore.errors import BadRequestError, NoSpaceError
from kvstore.types import Tier

from .helpers import KW, LAT, TR, node, req, view

P, D, C = Role.PREFILL, Role.DECODE, Role.COLOCATED


def test_round_robin_colocated_order() -> None:
    pol = make_policy("round_robin", **KW)
    v = view([node("a", C), node("b", C), node("c", C)])
    got = [pol.place(req(500), v) for _ in range(4)]
    assert [(d.prefill_node, d.decode_node, d.local_prefill) for d in got] == [
        ("a", "a", True),
        ("b", "b", True),
        ("c", "c", True),
        ("a", "a", True),
    ]


def test_round_robin_disaggregated_order() -> None:
    pol = make_policy("round_robin", **KW)
    v = view([node("p1", P), node("p2", P), node("d1", D), node("d2", D), node("d3", D)])
    got = [pol.place(req(500), v) for _ in range(4)]
    assert [(d.prefill_node, d.decode_node, d.local_prefill) for d in got] == [
        ("p1", "d1", False),
        ("p2", "d2", False),
        ("p1", "d3", False),
        ("p2", "d1", False),
    ]


def _random_series(v: ClusterView, seed: int) -> list[tuple[str, str]]:
    pol = make_policy("random", seed=seed, **KW)
    return [(d.prefill_node, d.decode_node) for d in (pol.place(req(500), v) for _ in range(20))]


def test_random_is_seeded_and_stays_in_role() -> None:
    v = view([node("p1", P), node("p2", P), node("d1", D), node("d2", D)])
    first, again = _random_series(v, 3), _random_series(v, 3)
    assert first == again
    assert {p for p, _ in first} == {"p1", "p2"} and {d for _, d in first} == {"d1", "d2"}


def test_least_loaded_picks_shortest_queue_and_fewest_seqs() -> None:
    prefill = [node("p1", P, wait=0.5), node("p2", P, wait=0.2), node("p3", P, wait=0.3)]
    decode = [node("d1", D, running=3), node("d2", D, running=1), node("d3", D, running=2)]
    v = view([*prefill, *decode])
    d = make_policy("least_loaded", **KW).place(req(1000), v)
    assert (d.prefill_node, d.decode_node) == ("p2", "d2")
    assert d.predicted_ttft_s == pytest.approx(0.2 + 0.1)  # wait + 1000 tokens x 0.1 ms
    assert d.predicted_tbt_s == pytest.approx(0.012)  # 10 ms + 2 sequences x 1 ms


def test_prefix_only_picks_longest_prefix_despite_queue() -> None:
    idx = DictPrefixIndex()
    idx.add("p1", range(2))
    idx.add("p2", range(5), Tier.DRAM)
    v = view([node("p1", P), node("p2", P, wait=3.0), node("d1", D)], idx)
    d = make_policy("prefix_only", **KW).place(req(1000), v)
    assert (d.prefill_node, d.cached_blocks, d.source_node) == ("p2", 5, "p2")
    # 3 s wait + 500 tokens from DRAM (500 kB at 1 GB/s) + 500 new tokens
    assert d.predicted_ttft_s == pytest.approx(3.0 + 0.0005 + 0.05)


def _trade_index() -> DictPrefixIndex:
    idx = DictPrefixIndex()
    idx.add("p1", range(8), Tier.DRAM)  # 800 of the 1000 prompt tokens
    return idx


def test_cache_load_takes_prefix_when_queue_is_short() -> None:
    v = view([node("p1", P, wait=0.05), node("p2", P), node("d1", D)], _trade_index())
    d = make_policy("cache_load", **KW).place(req(1000), v)
    # p1: 0.05 + 0.0008 (800 kB from DRAM) + 0.02 (200 new) = 0.0708 < p2: 0.1
    assert (d.prefill_node, d.cached_blocks) == ("p1", 8)
    assert d.predicted_ttft_s == pytest.approx(0.0708)


def test_cache_load_skips_prefix_behind_long_queue() -> None:
    v = view([node("p1", P, wait=0.09), node("p2", P), node("d1", D)], _trade_index())
    d = make_policy("cache_load", **KW).place(req(1000), v)
    # p1: 0.09 + 0.0008 + 0.02 = 0.1108 > p2: 0 + 0.1 (all 1000 tokens computed)
    assert (d.prefill_node, d.cached_blocks, d.source_node) == ("p2", 0, None)
    assert d.predicted_ttft_s == pytest.approx(0.1)


def test_cache_load_pooled_pulls_prefix_from_busy_node() -> None:
    v = view([node("p1", P, wait=0.09), node("p2", P), node("d1", D)], _trade_index(), True)
    d = make_policy("cache_load", **KW).place(req(1000), v)
    # p2 loads p1's 8 DRAM blocks over the network: min(1 GB/s, 1 GB/s) -> 0.0008 + 0.02
    assert (d.prefill_node, d.cached_blocks, d.source_node) == ("p2", 8, "p1")
    assert d.predicted_ttft_s == pytest.approx(0.0208)


def test_cache_load_pooled_prefix_spread_over_nodes() -> None:
    idx = PooledDictIndex()
    idx.add("p1", range(4))  # blocks 0-3 in p1's HBM
    idx.add("p2", range(4, 8), Tier.DRAM)  # blocks 4-7 in p2's DRAM
    v = view([node("p1", P), node("p2", P, wait=0.01), node("d1", D)], idx, True)
    d = make_policy("cache_load", **KW).place(req(1000), v)
    # p1: 400 kB from its HBM (0.4 us) + 400 kB of DRAM over the network (0.4 ms) + 200 new
    # p2: 0.01 wait + its own 400 kB DRAM + p1's 400 kB HBM at network speed + 200 new
    assert (d.prefill_node, d.cached_blocks, d.source_node) == ("p1", 8, None)
    assert d.predicted_ttft_s == pytest.approx(4e-7 + 4e-4 + 0.02)
    local_only = make_policy("cache_load", **KW).place(req(1000), view(list(v.nodes), idx))
    # without pooling p1 sees only its 4 blocks: 0.4 us + 600 new tokens
    assert (local_only.prefill_node, local_only.cached_blocks) == ("p1", 4)
    assert local_only.predicted_ttft_s == pytest.approx(4e-7 + 0.06)


def test_cache_load_balance_guard_moves_off_overloaded_node() -> None:
    idx = DictPrefixIndex()
    idx.add("p1", range(49))  # 4900 of 5000 tokens, in HBM
    v = view([node("p1", P, wait=0.03), node("p2", P), node("p3", P), node("d1", D)], idx, True)
    kw = {"latency": LAT, "transfer": replace(TR, network_bytes_per_s=1.5e8)}
    # p1 (best): 0.03 + 4.9e-6 + 0.01; p2/p3 pull 4.9 MB at 150 MB/s: 0.0326667 + 0.01.
    # mean wait 0.01: p1's 0.03 > 1.25 x 0.01, and 0.0426667 <= 1.1 x 0.0400049.
    d = make_policy("cache_load", **kw).place(req(5000), v)
    assert (d.prefill_node, d.source_node) == ("p2", "p1")
    assert d.predicted_ttft_s == pytest.approx(0.0426667)
    loose = make_policy("cache_load", config=CacheLoadConfig(slack=10.0), **kw)
    assert loose.place(req(5000), v).prefill_node == "p1"


def test_cache_load_idle_nodes_take_turns_on_near_ties() -> None:
    pol = make_policy("cache_load", **KW)
    idle = view([node("a", C), node("b", C), node("c", C)])
    assert [pol.place(req(1000), idle).prefill_node for _ in range(4)] == ["a", "b", "c", "a"]
    # TTFT 0.100, 0.104 (within 5%: a tie) and 0.120: turn t picks the first tied node at or
    # after position t mod 3: p1, p2, then p1 for turns 2 (p3 is not tied) and 3.
    near = make_policy("cache_load", **KW)
    v = view([node("p1", P), node("p2", P, wait=0.004), node("p3", P, wait=0.02), node("d", D)])
    assert [near.place(req(1000), v).prefill_node for _ in range(4)] == ["p1", "p2", "p1", "p1"]


def test_cache_load_routes_hot_prefix_to_replica() -> None:
    idx = DictPrefixIndex()
    idx.add("p1", range(9))
    idx.add("p2", range(9))  # replica of the hot prefix
    nodes = [node("p1", P, wait=1.0), node("p2", P, wait=0.1), node("p3", P, wait=0.5)]
    d = make_policy("cache_load", **KW).place(req(1000), view([*nodes, node("d1", D)], idx))
    # p1: 1.0 + 0.01; p2 (replica): 0.1 + 9e-7 + 0.01; p3 (no prefix): 0.5 + 0.1
    assert (d.prefill_node, d.cached_blocks) == ("p2", 9)
    assert d.predicted_ttft_s == pytest.approx(0.1100009)


def _cond_view(p_wait: float) -> ClusterView:
    return view([node("p1", P, wait=p_wait), node("d1", D, running=4)])


def test_conditional_local_prefill_for_short_prompt_with_deep_queue() -> None:
    v = _cond_view(2.0)
    d = make_policy("conditional", **KW).place(req(200), v)
    assert (d.prefill_node, d.decode_node, d.local_prefill) == ("d1", "d1", True)
    assert d.predicted_ttft_s == pytest.approx(0.02)
    plain = make_policy("cache_load", **KW).place(req(200), v)
    assert (plain.prefill_node, plain.local_prefill) == ("p1", False)


def test_conditional_remote_prefill_for_long_prompt() -> None:
    # local: 10000 tokens = 1.0 s stall > 0.5 s on a node running 4 streams
    d = make_policy("conditional", **KW).place(req(10_000), _cond_view(0.5))
    assert (d.prefill_node, d.decode_node, d.local_prefill) == ("p1", "d1", False)
    assert d.predicted_ttft_s == pytest.approx(1.5)


def test_rejection_with_retry_hint() -> None:
    v = view([node("p1", P, wait=2.0), node("d1", D)])
    with pytest.raises(RejectedError) as err:
        make_policy("cache_load", **KW).place(req(1000, ttft=0.5), v)
    assert err.value.retry_after_s == pytest.approx(1.6)  # 2.1 predicted - 0.5 objective
    assert isinstance(err.value, NoSpaceError) and err.value.grpc_code == "RESOURCE_EXHAUSTED"
    assert "retry after 1.600s" in str(err.value)
    idle = view([node("p", P), node("d", D)])
    with pytest.raises(RejectedError) as never:  # 0.1 s of compute alone misses 0.05 s
        make_policy("cache_load", **KW).place(req(1000, ttft=0.05), idle)
    assert never.value.retry_after_s is None


def test_rejection_on_tbt_and_kv_space() -> None:
    v = view([node("p1", P), node("d1", D, running=5)])
    with pytest.raises(RejectedError) as tbt:  # 10 + 6 ms > 12 ms; idle 11 ms would do
        make_policy("cache_load", **KW).place(req(1000, output=50, tbt=0.012), v)
    assert tbt.value.retry_after_s == pytest.approx(0.016 * 50)
    full = view([node("p1", P), node("d1", D, free=500), node("d2", D, free=700)])
    with pytest.raises(RejectedError) as kv:
        make_policy("cache_load", **KW).place(req(1000), full)
    assert kv.value.retry_after_s == pytest.approx(0.011 * 10)  # one decode of 10 tokens
    waits = make_policy("least_loaded", **KW).place(req(1000), full)  # admission off
    assert waits.decode_node == "d2"  # the most free KV: the request waits for memory there
    baseline = make_policy("round_robin", **KW)  # admission off: no SLO rejection
    loose = baseline.place(req(1000, output=50, tbt=0.012), v)
    assert loose.predicted_tbt_s == pytest.approx(0.016)


def test_unknown_policy_lists_valid_names() -> None:
    with pytest.raises(BadRequestError) as err:
        make_policy("fastest")
    names = "cache_load, conditional, flexible, least_loaded, prefix_only, random, round_robin"
    assert str(err.value) == f"unknown policy 'fastest'; valid: {names}"
    assert sorted(POLICIES) == names.split(", ")
    with pytest.raises(BadRequestError, match="bad arguments for policy 'random'"):
        make_policy("random", sead=1, **KW)


def test_empty_cluster_and_bad_input() -> None:
    with pytest.raises(BadRequestError, match="empty cluster"):
        ClusterView((), DictPrefixIndex())
    only_decode = view([node("d1", D)])
    with pytest.raises(BadRequestError, match="no PREFILL or COLOCATED"):
        make_policy("cache_load", **KW).place(req(100), only_decode)
    with pytest.raises(BadRequestError, match="impossible ttft_slo_s"):
        Request("r", 0.0, 100, 1, (), ttft_slo_s=0.0)
    with pytest.raises(BadRequestError):
        NodeState("n", P, kv_free_tokens=10, kv_capacity_tokens=5)


def test_prefill_share_decays_and_stretches_tbt() -> None:
    share = PrefillShare(window_s=5.0)
    share.add("d", now=0.0, seconds=1.0)
    assert share.share("d", 0.0) == pytest.approx(0.2)
    assert share.share("d", 5.0) == pytest.approx(0.2 * math.exp(-1))
    assert share.share("other", 3.0) == 0.0
    assert stretched_tbt_s(0.03, 0.4) == pytest.approx(0.05)
    assert stretched_tbt_s(0.03, 1.0) == math.inf


def test_conditional_stops_local_prefill_when_decode_streams_would_slow() -> None:
    pol = make_policy("conditional", **KW)
    v = _cond_view(2.0)  # remote queue 2 s: local is always sooner
    # d1 runs 4 streams: step with one more = 15 ms; budget 0.8 x 0.1 s = 80 ms, so its
    # prefill share may reach 1 - 15/80 = 0.8125. Each 2000-token local prefill (0.2 s)
    # adds 0.2 / 5 s = 0.04: 20 fit at t = 0, the 21st goes remote.
    at0 = [pol.place(Request(str(i), 0.0, 2000, 10, ()), v).local_prefill for i in range(21)]
    assert at0 == [True] * 20 + [False]
    # five seconds later the share has decayed to 0.8 / e: local again
    later = pol.place(Request("late", 5.0, 2000, 10, ()), v)
    assert (later.prefill_node, later.local_prefill) == ("d1", True)


def test_conditional_on_colocated_nodes_splits_prefill_and_decode() -> None:
    idx = DictPrefixIndex()
    idx.add("a", range(9))
    v = view([node("a", C, running=60), node("b", C)], idx)
    plain = make_policy("cache_load", **KW).place(req(1000), v)
    # a colocated node decodes its own prefills: 10 ms + 61 x 1 ms per step
    assert (plain.prefill_node, plain.decode_node, plain.predicted_tbt_s) == ("a", "a", 0.071)
    d = make_policy("conditional", **KW).place(req(1000), v)
    # prefill where the prefix is (0.01 s, + 1 ms KV move) beats 0.1 s on b; decode on idle b
    assert (d.prefill_node, d.decode_node, d.local_prefill) == ("a", "b", False)
    assert (d.predicted_ttft_s, d.predicted_tbt_s) == (pytest.approx(0.0100009), 0.011)
