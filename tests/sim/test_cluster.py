"""The simulated cluster on hand-made traces: exact TTFT/TBT, KV moves, pooling, memory waits.

A pinned placement policy (a real Policy) fixes where each request runs, so the expected
times follow by hand from a linear latency model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kvstore.conductor.api import ClusterView, Decision, Request, Role
from kvstore.conductor.latency import TransferModel
from kvstore.errors import BadRequestError
from kvstore.sim.cache import TierCapacity
from kvstore.sim.cluster import NodeSpec, uniform_nodes
from kvstore.sim.replay import Outcome, Slo, simulate
from kvstore.sim.traces import TraceLoad, TraceRequest


class LinearLatency:
    """1 ms per computed prompt token; 10 ms per decode step whatever the batch."""

    def prefill_s(self, new_tokens: int, cached_tokens: int) -> float:
        return 0.001 * new_tokens

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        return 0.01 if batch > 0 else 0.0


@dataclass
class Pinned:
    """Places request i on plan[i] = (prefill node, decode node)."""

    plan: dict[str, tuple[str, str]]
    name: str = "pinned"
    seen: list[tuple[float, int]] = field(default_factory=list)  # (n0 wait, n0 prefix)

    def place(self, req: Request, view: ClusterView) -> Decision:
        prefix = view.matches(req.block_hashes)[view.nodes[0].node_id].blocks
        self.seen.append((view.nodes[0].est_queue_wait_s, prefix))
        p, d = self.plan[req.request_id]
        return Decision(p, d, p == d, 0, 0.0, 0.0, "pinned")


XFER = TransferModel(
    kv_bytes_per_token=1000,
    tier_bytes_per_s=(1e9, 1e9, 1e8),
    network_bytes_per_s=1e7,
    overhead_s=0.0,
)
CACHE = TierCapacity(dram_blocks=8)


def _trace(*reqs: tuple[float, tuple[int, ...], int]) -> TraceLoad:
    return TraceLoad(
        tuple(TraceRequest(i, t, 512 * len(b), out, b) for i, (t, b, out) in enumerate(reqs))
    )


def _run(load: TraceLoad, specs: tuple[NodeSpec, ...], plan: dict[str, tuple[str, str]], **kw):
    return simulate(load, specs, Pinned(plan), LinearLatency(), XFER, **kw)


def test_colocated_prefill_first_and_local_prefix_hit() -> None:
    load = _trace((0.0, (1, 2), 3), (0.5, (1, 2), 3))
    spec = uniform_nodes(1, Role.COLOCATED, CACHE, 100_000)
    a, b = _run(load, spec, {"0": ("n0", "n0"), "1": ("n0", "n0")})
    assert a.ttft_s == pytest.approx(1.024)
    # r1 waits for r0's prefill, then hits both blocks: 1024 tokens at 1 GB/s + 1 token
    assert (b.cached_blocks, b.ttft_s) == (2, pytest.approx(0.524 + 0.001024 + 0.001))
    # r1's prefill ran before r0's first decode step: r0 saw it as a stall
    assert a.tbt_s == pytest.approx((0.002024 + 0.02) / 2)
    assert b.tbt_s == pytest.approx(0.01)


def test_disaggregated_pays_kv_move_before_decode() -> None:
    specs = (NodeSpec("p0", Role.PREFILL, CACHE, 1), NodeSpec("d0", Role.DECODE, CACHE, 10_000))
    (a,) = _run(_trace((0.0, (1, 2), 3)), specs, {"0": ("p0", "d0")})
    assert a.ttft_s == pytest.approx(1.024)
    assert a.tbt_s == pytest.approx((0.1024 + 0.02) / 2)  # 1024 tokens * 1000 B at 10 MB/s
    assert (a.prefill_node, a.decode_node) == ("p0", "d0")


@pytest.mark.parametrize(
    ("pooled", "blocks", "ttft"), [(True, 2, 0.1024 + 0.001), (False, 0, 1.024)]
)
def test_pooled_store_serves_another_nodes_prefix(pooled: bool, blocks: int, ttft: float) -> None:
    load = _trace((0.0, (1, 2), 1), (5.0, (1, 2), 1))
    specs = uniform_nodes(2, Role.COLOCATED, CACHE, 100_000)
    _, b = _run(load, specs, {"0": ("n0", "n0"), "1": ("n1", "n1")}, pooled=pooled)
    assert (b.cached_blocks, b.ttft_s) == (blocks, pytest.approx(ttft))


def test_decode_memory_wait_is_fifo() -> None:
    load = _trace((0.0, (1, 2), 3), (0.0, (3, 4), 3))
    specs = uniform_nodes(1, Role.COLOCATED, CACHE, 1500)  # one 1027-token sequence at a time
    a, b = _run(load, specs, {"0": ("n0", "n0"), "1": ("n0", "n0")})
    assert (a.ttft_s, b.ttft_s) == (pytest.approx(1.024), pytest.approx(2.048))
    assert a.tbt_s == pytest.approx((1.024 + 0.02) / 2)  # r1's prefill stalls r0 once
    assert b.tbt_s == pytest.approx(0.01 + 0.01)  # waits for r0's memory: finishes at 2.088


def test_view_reports_queue_and_prefix() -> None:
    load = _trace((0.0, (1, 2), 1), (0.1, (1, 2, 3), 1), (2.0, (1, 2, 3), 1))
    policy = Pinned({str(i): ("n0", "n0") for i in range(3)})
    simulate(load, uniform_nodes(1, Role.COLOCATED, CACHE, 100_000), policy, LinearLatency(), XFER)
    (w0, p0), (w1, p1), (w2, p2) = policy.seen
    assert (w0, p0) == (0.0, 0)
    assert (w1, p1) == (pytest.approx(0.924), 0)  # r0 still prefilling: nothing cached yet
    assert (w2, p2) == (0.0, 3)


def test_bad_inputs() -> None:
    with pytest.raises(BadRequestError, match="impossible objectives"):
        Slo(ttft_s=0.0, tbt_s=0.1)
    with pytest.raises(BadRequestError, match="at least one node"):
        uniform_nodes(0, Role.COLOCATED, CACHE, 10)
    with pytest.raises(BadRequestError, match="empty cluster"):
        _run(_trace((0.0, (1,), 1)), (), {"0": ("n0", "n0")})
    with pytest.raises(BadRequestError, match="unknown nodes"):
        _run(_trace((0.0, (1,), 1)), uniform_nodes(1, Role.COLOCATED, CACHE, 10), {"0": ("x", "x")})


def test_outcome_of_rejection_counts_as_miss() -> None:
    from kvstore.sim.metrics import summarize

    outs = [
        Outcome(0, 0.5, 0.05, 0, 1, "n0", "n0"),
        Outcome(1, None, None, 0, 1, None, None, rejected=True),
        Outcome(2, 2.0, 0.05, 0, 1, "n0", "n0"),
    ]
    s = summarize(outs, Slo(ttft_s=1.0, tbt_s=0.1))
    assert (s.n, s.finished, s.rejected) == (3, 2, 1)
    assert (s.ttft_attained, s.tbt_attained, s.attained) == (1 / 3, 2 / 3, 1 / 3)
