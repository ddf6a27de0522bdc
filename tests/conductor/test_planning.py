"""Pool planner and hot-prefix replication on hand-computed loads."""

from __future__ import annotations

import pytest

from kvstore.conductor.api import Request
from kvstore.conductor.planner import ObservedLoad, PoolPlan, max_decode_batch, plan_pools
from kvstore.conductor.replication import (
    Replication,
    ReplicationConfig,
    recommend_replications,
)
from kvstore.errors import BadRequestError

from .helpers import LAT

LOAD = ObservedLoad(
    request_rate=10.0, mean_prompt_tokens=2000, mean_cached_tokens=1000, mean_output_tokens=100
)


def test_planner_splits_by_demand() -> None:
    # prefill: 10 req/s x 1000 new tokens x 0.1 ms = 1.0 busy node.
    # decode: step 10 + B ms <= 50 ms -> B = 40, 40 tokens / 0.05 s = 800 tok/s per node;
    # 10 x 100 = 1000 tok/s -> 1.25 nodes. 9 nodes x 1 / 2.25 = 4 prefill, 5 decode.
    plan = plan_pools(LOAD, 9, LAT, tbt_slo_s=0.05, kv_capacity_tokens=1_000_000)
    assert plan == PoolPlan(
        4, 5, "prefill demand 1.00 nodes, decode demand 1.25 nodes (batch 40, 800 tok/s per node)"
    )


def test_planner_memory_bound_decode_and_overload() -> None:
    # 21,000 KV tokens / 2,100 per sequence -> batch 10, step 20 ms -> 500 tok/s -> 2.0 nodes
    plan = plan_pools(LOAD, 3, LAT, tbt_slo_s=0.05, kv_capacity_tokens=21_000)
    assert (plan.prefill_nodes, plan.decode_nodes) == (1, 2)
    assert "overloaded" not in plan.reason  # demand 1.0 + 2.0 = 3 nodes: just enough
    small = plan_pools(LOAD, 2, LAT, 0.05, 21_000)
    assert (small.prefill_nodes, small.decode_nodes) == (1, 1)
    assert small.reason.endswith("overloaded: 3.00 > 2 nodes")
    assert max_decode_batch(LAT, 0.05, 2050, 21_000, 2100) == 10


def test_planner_bad_input() -> None:
    with pytest.raises(BadRequestError, match="impossible TBT objective"):
        plan_pools(LOAD, 4, LAT, tbt_slo_s=0.005, kv_capacity_tokens=1_000_000)
    with pytest.raises(BadRequestError, match="at least 2 nodes"):
        plan_pools(LOAD, 1, LAT, tbt_slo_s=0.05, kv_capacity_tokens=1_000_000)
    with pytest.raises(BadRequestError):
        ObservedLoad(1.0, 100, 200, 10)


def test_observed_load_from_requests() -> None:
    reqs = [Request(str(i), float(i), 1000 * (i + 1), 10 * (i + 1)) for i in range(4)]
    load = ObservedLoad.from_requests(reqs, window_s=2.0, hit_ratio=0.5)
    assert load == ObservedLoad(2.0, 2500.0, 1250.0, 25.0)


def test_replication_moves_hot_prefixes_off_overloaded_node() -> None:
    load = {"a": 10.0, "b": 2.0, "c": 3.0, "d": 1.0}  # mean 4, limit 5: a is overloaded
    hits = {"X": {"a": 6}, "Y": {"a": 3, "c": 1}, "Z": {"a": 1}}
    # a's load per hit = 10 / 10. X (6 hits) -> d, the least loaded: a 10 -> 7, d 1 -> 4.
    # Y (3 hits) -> b (c holds Y; d is no longer under the mean): a 7 -> 5.5. Z: too cold.
    assert recommend_replications(load, hits) == [
        Replication("X", "a", "d"),
        Replication("Y", "a", "b"),
    ]
    one = recommend_replications(load, hits, ReplicationConfig(max_per_round=1))
    assert one == [Replication("X", "a", "d")]


def test_replication_balanced_or_empty() -> None:
    assert recommend_replications({"a": 1.0, "b": 1.2}, {"X": {"a": 9}}) == []
    assert recommend_replications({"a": 0.0, "b": 0.0}, {"X": {"a": 9}}) == []
    with pytest.raises(BadRequestError, match="empty cluster"):
        recommend_replications({}, {})
