"""The conductor's real policies driven by the simulator on hand-made clusters and traces.

Latency: 1 ms per computed prompt token, 10 ms per decode step; KV moves at 10 MB/s with
1000 bytes per token. Expected placements are worked out by hand in the comments.
"""

from __future__ import annotations

import pytest

from kvstore.conductor.api import Role
from kvstore.conductor.registry import make_policy
from kvstore.sim.cache import TierCapacity
from kvstore.sim.cluster import NodeSpec, uniform_nodes
from kvstore.sim.replay import simulate
from kvstore.sim.traces import TraceLoad, TraceRequest

from .test_cluster import XFER, LinearLatency

CACHE = TierCapacity(dram_blocks=64)
TWO = uniform_nodes(2, Role.COLOCATED, CACHE, 1_000_000)

# r0 fills n0 with blocks 1-4 (2.048 s); r2 at t=10 reuses them (2 new blocks: busy until
# ~11.03 s); r3 and r4 arrive while n0 is busy and share the same 4-block prefix.
SHARED = (
    (0.0, (1, 2, 3, 4), 1),
    (3.0, (50,), 1),
    (10.0, (1, 2, 3, 4, 5, 6), 1),
    (10.1, (1, 2, 3, 4, 7, 8), 1),
    (10.2, (1, 2, 3, 4, 9, 10), 1),
)


def _trace(reqs, sizes=None) -> TraceLoad:
    return TraceLoad(
        tuple(
            TraceRequest(i, t, sizes[i] if sizes else 512 * len(b), out, b)
            for i, (t, b, out) in enumerate(reqs)
        )
    )


def _place(name: str, load: TraceLoad, specs: tuple[NodeSpec, ...], pooled: bool = False, **kw):
    policy = make_policy(name, latency=LinearLatency(), transfer=XFER, **kw)
    outs = simulate(load, specs, policy, LinearLatency(), XFER, pooled=pooled)
    return [(o.prefill_node, o.decode_node) for o in outs], outs


@pytest.mark.parametrize(
    ("name", "expect"),
    [
        # in turn, whatever the load
        ("round_robin", ["n0", "n1", "n0", "n1", "n0"]),
        # idle nodes tie on id; r3 sees n0 busy -> n1; r4: n0 (0.83 s left) < n1 (3 s) -> n0
        ("least_loaded", ["n0", "n0", "n0", "n1", "n0"]),
        # the longest cached prefix, load ignored: everything with blocks 1-4 piles on n0
        ("prefix_only", ["n0", "n0", "n0", "n0", "n0"]),
        # idle ties rotate (r1 -> n1); r2 hits 1-4 on n0; r3: n0 waits 0.93 s + 1.03 s vs
        # 3.07 s cold on n1 -> n0; r4: n0's queue is over (1 + slack) x mean and n1 (3.07 s)
        # is within the margin of n0's 2.88 s -> n1
        ("cache_load", ["n0", "n1", "n0", "n0", "n1"]),
    ],
)
def test_placements_local_caches(name: str, expect: list[str]) -> None:
    got, _ = _place(name, _trace(SHARED), TWO)
    assert [p for p, _ in got] == expect
    assert all(p == d for p, d in got)  # COLOCATED nodes decode their own prefills


def test_cache_load_hits_more_than_least_loaded() -> None:
    _, smart = _place("cache_load", _trace(SHARED), TWO)
    _, blind = _place("least_loaded", _trace(SHARED), TWO)
    assert [o.cached_blocks for o in smart] == [0, 0, 4, 4, 0]
    assert [o.cached_blocks for o in blind] == [0, 0, 4, 0, 4]


def test_pooled_store_lets_the_other_node_reuse_the_prefix() -> None:
    # r3: n1 loads 1-4 from n0 (2048 tokens at 10 MB/s, 0.2 s) + 1.02 s < n0's 1.95 s -> n1;
    # r4: n0 (0.83 + 1.03 s) < n1 (1.13 + 1.23 s) -> n0
    got, outs = _place("cache_load", _trace(SHARED), TWO, pooled=True)
    assert [p for p, _ in got] == ["n0", "n1", "n0", "n1", "n0"]
    assert [o.cached_blocks for o in outs] == [0, 0, 4, 4, 4]
    assert outs[3].ttft_s == pytest.approx(0.2048 + 1.024)


def test_random_is_seeded() -> None:
    load = _trace(tuple((float(i), (100 + i,), 1) for i in range(20)))
    a, _ = _place("random", load, TWO, seed=3)
    b, _ = _place("random", load, TWO, seed=3)
    assert a == b
    assert {p for p, _ in a} == {"n0", "n1"}


PD = (NodeSpec("p0", Role.PREFILL, CACHE, 1_000_000), NodeSpec("d0", Role.DECODE, CACHE, 1_000_000))
# r0: long, d0 idle -> prefill locally on d0 (no KV move); r1 at t=5: d0 is decoding r0, a
# 4.1 s prefill would stall it -> p0; r2: 0.3 s prefill (< max_local_stall_s) -> local on d0
COND = ((0.0, (1, 2, 3, 4, 5, 6, 7, 8), 100), (5.0, tuple(range(10, 18)), 1), (5.01, (30,), 1))
COND_SIZES = [4096, 4096, 300]


def test_conditional_chooses_local_or_remote_prefill_per_request() -> None:
    got, outs = _place("conditional", _trace(COND, COND_SIZES), PD)
    assert got == [("d0", "d0"), ("p0", "d0"), ("d0", "d0")]
    assert outs[0].ttft_s == pytest.approx(4.096)


def test_disaggregated_always_hands_over() -> None:
    got, outs = _place("cache_load", _trace(COND, COND_SIZES), PD)
    assert got == [("p0", "d0")] * 3
    # r0's KV (4096 tokens x 1000 B at 10 MB/s) moves before its 99 decode steps
    assert outs[0].tbt_s == pytest.approx((0.4096 + 99 * 0.01) / 99)
