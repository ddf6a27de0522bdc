"""The simulator's new knobs on hand-made traces: TTFT parts, per-node latency profiles,
context limits, role changes under a controller, the local-prefill limit run by the same
policy code as the gRPC conductor, and the placement helpers."""

from __future__ import annotations

import pytest

from kvstore.conductor.api import Role
from kvstore.conductor.hardware import NodeKind, machines, node_kind
from kvstore.conductor.registry import make_policy
from kvstore.errors import BadRequestError, NotFoundError
from kvstore.sim.cluster import NodeSpec, SimCluster, uniform_nodes
from kvstore.sim.metrics import LatencySummary
from kvstore.sim.placement import Fleet, candidates, goodput_search, search_placement
from kvstore.sim.replay import Control, Slo, simulate
from kvstore.sim.traces import synthetic_poisson
from tests.sim.test_cluster import CACHE, XFER, LinearLatency, Pinned, _run, _trace


class FastLatency(LinearLatency):
    """A 4x faster prefill (an H100 next to LinearLatency's A100, say)."""

    def prefill_s(self, new_tokens: int, cached_tokens: int) -> float:
        return 0.00025 * new_tokens


def test_ttft_parts_add_up_queue_load_by_source_and_tier_compute() -> None:
    load = _trace((0.0, (1, 2), 1), (2.0, (1, 2, 3), 1))
    specs = uniform_nodes(2, Role.COLOCATED, CACHE, 100_000)
    a, b = _run(load, specs, {"0": ("n0", "n0"), "1": ("n1", "n1")}, pooled=True)
    assert (a.queue_s, a.load_s, a.compute_s) == (0.0, {}, pytest.approx(1.024))
    # r1 on n1 reads r0's 2 blocks from n0's DRAM over the network (10 MB/s), computes 512
    assert b.load_s == {"pooled DRAM": pytest.approx(1024 * 1000 / 1e7)}
    assert b.compute_s == pytest.approx(0.512) and b.queue_s == 0.0
    assert b.ttft_s == pytest.approx(b.queue_s + sum(b.load_s.values()) + b.compute_s)


def test_each_node_computes_with_its_own_profile() -> None:
    specs = (
        NodeSpec("h0", Role.PREFILL, CACHE, 1, profile="h100"),
        NodeSpec("a0", Role.PREFILL, CACHE, 1),
        NodeSpec("d0", Role.DECODE, CACHE, 100_000),
    )
    load = _trace((0.0, (1, 2), 2), (0.0, (3, 4), 2))
    plan = {"0": ("h0", "d0"), "1": ("a0", "d0")}
    fast, slow = simulate(load, specs, Pinned(plan), LinearLatency(), XFER,
                          latencies={"h100": FastLatency()})  # fmt: skip
    assert (fast.compute_s, slow.compute_s) == (pytest.approx(0.256), pytest.approx(1.024))
    with pytest.raises(BadRequestError, match=r"no latency model for profiles \['h100'\]"):
        simulate(load, specs, Pinned(plan), LinearLatency(), XFER)


def test_requests_beyond_every_context_are_rejected_and_counted() -> None:
    specs = tuple(
        NodeSpec(f"n{i}", Role.COLOCATED, CACHE, 100_000, max_context_tokens=1100) for i in range(2)
    )
    load = _trace((0.0, (1, 2), 3), (0.1, (3, 4, 5), 3))  # 1027 and 1539 tokens
    a, b = _run(load, specs, {"0": ("n0", "n0"), "1": ("n1", "n1")})
    assert (a.too_long, b.too_long, b.rejected, b.ttft_s) == (False, True, True, None)
    with pytest.raises(BadRequestError, match="all 1 requests exceed every node's context"):
        _run(_trace((0.0, (3, 4, 5), 3)), specs, {"0": ("n0", "n0")})


def test_a_controller_changes_roles_while_the_simulation_runs() -> None:
    specs = (NodeSpec("p0", Role.PREFILL, CACHE, 1), NodeSpec("d0", Role.DECODE, CACHE, 10**6),
             NodeSpec("d1", Role.DECODE, CACHE, 10**6))  # fmt: skip
    seen: list[tuple[float, int, Role]] = []

    def flip(cluster: SimCluster, reqs: object) -> None:
        states = {n.node_id: n.role for n in cluster.node_states()}
        seen.append((cluster.loop.now, len(reqs), states["d1"]))  # type: ignore[arg-type]
        cluster.set_role("d1", Role.PREFILL)

    load = synthetic_poisson(40, rate=4.0, mean_input=600, mean_output=20, seed=3)
    policy = make_policy("cache_load", latency=LinearLatency(), transfer=XFER, admission=False)
    outs = simulate(load, specs, policy, LinearLatency(), XFER, control=Control(flip, 4.0))
    assert [(t, r) for t, _, r in seen[:2]] == [(4.0, Role.DECODE), (8.0, Role.PREFILL)]
    assert sum(n for _, n, _ in seen) == sum(r.arrival_s < seen[-1][0] for r in load.requests)
    after = [o for o, r in zip(outs, load.requests, strict=True) if r.arrival_s > 4.0]
    assert any(o.prefill_node == "d1" for o in after)  # new prefills go to the flipped node
    assert all(o.decode_node != "d1" for o in after)  # ... and no new decodes


def test_the_local_prefill_limit_binds_in_the_simulator_too() -> None:
    load = synthetic_poisson(60, rate=6.0, mean_input=800, mean_output=30, seed=5)
    lat = LinearLatency()

    def locals_over(limit: int | None) -> tuple[int, int]:
        specs = (NodeSpec("p0", Role.PREFILL, CACHE, 1),
                 NodeSpec("d0", Role.DECODE, CACHE, 10**6, local_prefill_tokens=limit))  # fmt: skip
        policy = make_policy("flexible", latency=lat, transfer=XFER)
        outs = simulate(load, specs, policy, lat, XFER, slo=Slo(1.0, 0.5))
        local = [r for o, r in zip(outs, load.requests, strict=True)
                 if o.prefill_node == o.decode_node == "d0"]  # fmt: skip
        return len(local), sum(r.input_len > (limit or 10**9) for r in local)

    unlimited, _ = locals_over(None)
    limited, over = locals_over(500)
    assert unlimited > limited > 0 and over == 0  # rescues happen, never over the limit
    assert locals_over(0)[0] == 0


def test_goodput_search_brackets_and_bisects() -> None:
    def run(rate: float) -> LatencySummary:
        a = 1.0 if rate <= 3.3 else 0.0
        return LatencySummary(1, 1, 0, 0, 0, 0, 0, 0, 0, a, a, a)

    up = goodput_search(run, 1.0, grow=2.0, bisect=4)  # 1, 2, 4 (fails), then bisect 2..4
    assert [r for r, _ in up.points[:3]] == [1.0, 2.0, 4.0] and 3.0 < up.goodput <= 3.3
    down = goodput_search(run, 10.0, grow=2.0, bisect=0)  # 10, 5 fail, 2.5 passes
    assert down.goodput == 2.5
    assert goodput_search(lambda r: run(99.0), 1.0, steps=2).goodput == 0.0


def test_placement_candidates_fill_the_budget_and_the_search_picks_the_best() -> None:
    kinds = [node_kind("opt-13b", "a100", tp) for tp in (1, 2, 4)]
    cands = candidates(kinds, 8)
    assert len(cands) == 21 and all(c.gpus == 8 for c in cands)
    with pytest.raises(BadRequestError, match="fills 1 GPUs"):
        candidates(kinds, 1)

    def score(f: Fleet) -> float:  # prefers prefill-heavy fleets, then fewer GPUs per node
        return len(f.prefill) - 0.1 * f.kinds[0].gpus

    best = search_placement(kinds, 4, score)
    assert best.best.describe() == "3x prefill TP1 + 1x decode TP1" and best.per_gpu == 2.9 / 4


def test_fleet_cost_and_power_come_from_the_shipped_machine_data() -> None:
    table = machines()
    assert (table["dgx-a100"].cost_per_hour, table["dgx-h100"].power_w) == (17.6, 10200.0)
    half: NodeKind = node_kind("llama2-70b", "h100", 4)  # half a DGX-H100
    assert (half.cost_per_hour, half.power_w) == (19.0, 5100.0)
    fleet = Fleet(
        "HA", (node_kind("llama2-70b", "h100", 8),), (node_kind("llama2-70b", "a100", 8),)
    )
    assert (fleet.cost_per_hour, fleet.power_kw, fleet.gpus) == (55.6, 16.7, 16)
    with pytest.raises(NotFoundError, match="available"):
        node_kind("llama2-70b", "mi300", 8)
