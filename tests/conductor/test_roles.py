"""The split search (a fake evaluator with a known optimum) and the online role balancer's
hysteresis (models in helpers.py: prefill 0.1 ms per token, decode step 10 ms + 1 ms per
sequence)."""

from __future__ import annotations

import pytest

from kvstore.conductor.api import Request, Role
from kvstore.conductor.planner import rank_splits, search_split
from kvstore.conductor.roles import BalancerConfig, Flip, RoleBalancer
from kvstore.errors import BadRequestError
from tests.conductor.helpers import LAT, node


def test_search_finds_the_best_split_beyond_its_first_radius() -> None:
    calls: list[int] = []

    def evaluate(k: int) -> float:  # colocated 0.5; splits peak at 7 prefill nodes
        calls.append(k)
        return 0.5 if k == 0 else 1.0 - abs(k - 7) / 10

    got = search_split(evaluate, 10, start=3, radius=1)
    assert (got.prefill_nodes, got.met) == (7, True)
    assert calls == [0, 2, 3, 4, 5, 6, 7, 8]  # colocated, 3 +- 1, then up while it improves
    assert got.tried[7] == pytest.approx(1.0) and "attainment 1.000" in got.reason


def test_search_prefers_colocated_when_it_wins_and_says_when_nothing_meets() -> None:
    got = search_split(lambda k: 0.95 if k == 0 else 0.5, 8, start=4)
    assert got.prefill_nodes == 0 and got.met
    low = search_split(lambda k: 0.1 * k, 6, start=2, target=0.9)
    assert (low.prefill_nodes, low.met) == (5, False)
    assert (
        low.reason.startswith("no split tried meets")
        and "closest: 5 prefill at 0.500" in low.reason
    )
    with pytest.raises(BadRequestError):
        search_split(lambda k: 1.0, 1, start=1)


def test_rank_splits_tries_every_split_and_decides_by_the_mean_over_windows() -> None:
    calls: list[tuple[int, int]] = []

    def evaluate(k: int, w: int) -> float:  # window 0 peaks at 6 prefill nodes, window 1 at 2
        calls.append((k, w))
        return 0.3 if k == 0 else 1.0 - (k - (6 if w == 0 else 2)) ** 2 / 50

    got = rank_splits(evaluate, 2, 10, start=5, shortlist=4)
    assert [k for k, w in calls if w == 0] == list(range(10))  # every split on window 0
    assert sorted(k for k, w in calls if w == 1) == [4, 5, 6, 7]  # its 4 best on window 1
    # means: 4 -> 1 - (4 + 4) / 100 = 0.92; 5 and 7 -> 0.90 and 0.74; 6 -> 0.84
    assert (got.prefill_nodes, got.met) == (4, True) and got.score == pytest.approx(0.92)
    assert "4 best on 2 windows" in got.reason


def test_rank_splits_breaks_ties_by_headroom_and_says_when_nothing_meets() -> None:
    flat = rank_splits(lambda k, w: 0.95 if 2 <= k <= 5 else 0.1, 1, 8, start=2,
                       headroom=lambda k: {2: 0.5, 3: 0.8, 4: 0.8, 5: 0.6}[k])  # fmt: skip
    assert flat.prefill_nodes == 3  # 3 and 4 keep the most headroom; 3 is nearer the start
    assert "ties by headroom 2: 0.500, 3: 0.800, 4: 0.800, 5: 0.600" in flat.reason
    low = rank_splits(lambda k, w: 0.05 * k, 2, 6, start=2)
    assert (low.prefill_nodes, low.met) == (5, False)
    assert low.reason.startswith("no split tried meets the objectives (attainment >= 0.9)")
    assert "closest: 5 prefill at 0.250" in low.reason
    with pytest.raises(BadRequestError):
        rank_splits(lambda k, w: 1.0, 0, 4, start=1)


def _period(prompt: int, output: int, n: int = 60) -> list[Request]:
    return [Request(str(i), float(i), prompt, output) for i in range(n)]


def test_balancer_flips_only_after_patience_and_one_node_at_a_time() -> None:
    bal = RoleBalancer(LAT, tbt_slo_s=0.05, kv_capacity_tokens=1_000_000,
                       config=BalancerConfig(period_s=60.0, patience=2))  # fmt: skip
    pool = [node("p0", Role.PREFILL), node("d0", Role.DECODE, wait=0.0, running=3),
            node("d1", Role.DECODE, running=1), node("d2", Role.DECODE, running=2)]  # fmt: skip
    # 1 req/s of 20,000-token prompts: 2 s of prefill per second -> prefill wants most nodes
    heavy = _period(20_000, 10)
    assert bal.observe(heavy, pool) == []  # first period: patience
    flips = bal.observe(heavy, pool)
    assert [f.node_id for f in flips] == ["d1"]  # the least busy decode node, one per period
    assert flips[0].role == Role.PREFILL and flips[0].reason.startswith("demand split")
    assert isinstance(flips[0], Flip)


def test_balancer_holds_still_under_alternating_noise_and_quiet_periods() -> None:
    bal = RoleBalancer(LAT, 0.05, 1_000_000, BalancerConfig(patience=2))
    pool = [node("p0", Role.PREFILL), node("p1", Role.PREFILL),
            node("d0", Role.DECODE), node("d1", Role.DECODE)]  # fmt: skip
    heavy, light = _period(20_000, 10), _period(100, 2000)
    for _ in range(3):  # up, down, up, down...: the streak resets each time
        assert bal.observe(heavy, pool) == []
        assert bal.observe(light, pool) == []
    assert bal.observe([], pool) == []  # a quiet period changes nothing
    assert [want for _, want in bal.history] == [3, 1] * 3


def _pool() -> list:
    # p0 has 2 s of queued prefill; d0 decodes 8 streams (8000 context tokens), d1 none
    return [node("p0", Role.PREFILL, wait=2.0), node("p1", Role.PREFILL),
            node("d0", Role.DECODE, running=8), node("d1", Role.DECODE)]  # fmt: skip


def _reqs(n: int = 60) -> list[Request]:
    return [Request(f"r{i}", 0.5 * i, 1000, 100) for i in range(n)]


def test_gain_must_beat_the_flip_cost_for_patience_periods() -> None:
    """A candidate is taken only when its predicted gain beats drain/KV cost + noise floor
    twice in a row; the cheapest node of the shrinking pool moves (p1: nothing queued)."""
    cfg = BalancerConfig(period_s=30.0, min_gain=0.01, patience=2)
    bal = RoleBalancer(LAT, 0.1, 100_000, cfg)
    scores = {2: 100.0, 1: 140.0, 3: 90.0}  # one prefill node fewer: +40 requests

    def evaluate(k: int) -> tuple[float, int]:
        return scores[k], 200

    assert bal.observe(_reqs(), _pool(), evaluate) == []  # patience
    flips = bal.observe(_reqs(), _pool(), evaluate)
    assert [(f.node_id, f.role) for f in flips] == [("p1", Role.DECODE)]
    v = bal.verdicts[-1]
    assert (v.current, v.best, v.gain, v.flipped) == (2, 1, 40.0, True)
    # cost: 2 requests/s x 0 s of p1's queue / 4 nodes + 1% of the 200 judged
    assert v.cost == pytest.approx(2.0)
    assert "predicted +40.0 requests" in flips[0].reason


def test_a_gain_smaller_than_its_cost_never_flips() -> None:
    """+1.5 requests against a floor of 2 (1% of 200): never, however long it lasts."""
    bal = RoleBalancer(LAT, 0.1, 100_000, BalancerConfig(period_s=30.0, patience=1, min_gain=0.01))
    for _ in range(5):
        assert bal.observe(_reqs(), _pool(), lambda k: (100.0 + 1.5 * (k == 1), 200)) == []
    assert all(not v.flipped and v.best == 2 for v in bal.verdicts)


def test_flip_cost_counts_drain_or_kv_move_and_the_prefill_queue() -> None:
    from kvstore.conductor.latency import TransferModel

    bal = RoleBalancer(LAT, 0.1, 100_000)
    busy = node("d0", Role.DECODE, running=8)
    reqs = _reqs()  # 100 output tokens each: half of them left, on average
    drain = 50 * LAT.decode_step_s(8, 8000)
    assert bal.flip_cost_s(busy, reqs) == pytest.approx(drain)
    assert bal.flip_cost_s(node("d1", Role.DECODE), reqs) == 0.0
    assert bal.flip_cost_s(node("p0", Role.PREFILL, wait=2.0), reqs) == 2.0
    tr = TransferModel(kv_bytes_per_token=1 << 20, network_bytes_per_s=1e9)
    moving = RoleBalancer(LAT, 0.1, 100_000, transfer=tr).flip_cost_s(busy, reqs)
    assert moving == pytest.approx(min(drain, tr.overhead_s + 8000 * (1 << 20) / 1e9))


def test_a_flipped_node_is_not_flipped_back_within_its_cooldown() -> None:
    cfg = BalancerConfig(period_s=30.0, patience=1, cooldown_periods=3)
    bal = RoleBalancer(LAT, 0.1, 100_000, cfg)
    pool = _pool()
    flips = bal.observe(_reqs(), pool, lambda k: (200.0 if k == 3 else 100.0, 200))
    assert [(f.node_id, f.role) for f in flips] == [("d1", Role.PREFILL)]
    after = [n if n.node_id != "d1" else node("d1", Role.PREFILL) for n in pool]
    # now fewer prefill nodes look better, but d1 (just flipped) may not go back; p1 may
    flips = bal.observe(_reqs(), after, lambda k: (200.0 if k == 2 else 100.0, 200))
    assert [(f.node_id, f.role) for f in flips] == [("p1", Role.DECODE)]
