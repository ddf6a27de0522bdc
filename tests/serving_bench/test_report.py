"""Report figures, ratios and verdicts from hand-made records."""

from __future__ import annotations

import pytest

from kvstore.serving_bench.metrics import RequestRecord
from kvstore.serving_bench.report import interference_report, render_table
from kvstore.serving_bench.scenario import BenchRun, ModeRun


def _rec(kind: str, ttft: float, gaps: list[float], **kw: float) -> RequestRecord:
    r = RequestRecord("r", kind, 16, sent_s=0.0, **kw)  # type: ignore[arg-type]
    times = [ttft]
    for g in gaps:
        times.append(times[-1] + g)
    r.add_chunk(times[-1], list(range(len(times))), times)
    return r


def _mode(name: str, stream_gap: float, burst_gap: float, light_ttft: float) -> ModeRun:
    run = ModeRun(name)
    run.add("stream", [_rec("stream", 0.1, [stream_gap] * 10)])
    run.add("burst", [_rec("stream", 0.2, [stream_gap] * 9 + [burst_gap]),
                      _rec("burst", 0.5, [stream_gap], compute_s=0.4, publish_s=0.02,
                           publish_wait_s=0.004, pull_s=0.008, kv_bytes=1 << 20)])  # fmt: skip
    run.add("light", [_rec("stream", light_ttft, [stream_gap] * 3, node_queue_s=0.03,
                           compute_s=0.05)])  # fmt: skip
    return run


def test_ratios_and_verdicts() -> None:
    co = _mode("colocated", 0.02, 0.4, 0.1)
    dis = _mode("disaggregated", 0.02, 0.025, 0.15)
    dis.add("long", [_rec("long", 2.0, [0.02], compute_s=2.0, publish_s=0.1, publish_wait_s=0.01,
                          pull_s=0.04, kv_bytes=32 << 20)])  # fmt: skip
    report = interference_report(BenchRun(1.5, {"colocated": 1.4, "disaggregated": 1.6},
                                          {"colocated": co, "disaggregated": dis}))  # fmt: skip
    # one gap in ten of the burst-phase stream is the stall: p99 interpolates near it
    co_burst = report["colocated"]["burst"]["tbt_ms"]["p99"]
    assert co_burst == pytest.approx(0.02e3 + 0.91 * 0.38e3, rel=1e-6)
    assert report["colocated"]["stream"]["tbt_ms"]["p99"] == pytest.approx(20.0)
    r = report["ratios"]
    assert r["colocated_tbt_burst_over_no_burst"] == pytest.approx(co_burst / 20.0, abs=1e-3)
    assert r["light_ttft_p50_disagg_over_colocated"] == pytest.approx(1.5)
    t = report["targets"]
    assert t["colocated_tbt_at_least_3x"]["met"] is True
    assert t["colocated_wins_light_ttft"]["met"] is True
    assert t["kv_transfer_under_10pct"]["value"] == pytest.approx(0.07)
    assert t["kv_transfer_under_10pct"]["met"] is True
    assert report["disaggregated"]["long"]["prompt_tokens"] == 16
    assert report["slowdown"] == {"applied": 1.5,
                                  "measured": {"colocated": 1.4, "disaggregated": 1.6}}  # fmt: skip
    assert report["colocated"]["burst_prefill_ms"]["p50"] == pytest.approx(400.0)
    assert report["colocated"]["light"]["node_queue_ms"]["p50"] == pytest.approx(30.0)
    assert report["colocated"]["light"]["prefill_compute_ms"]["p50"] == pytest.approx(50.0)
    table = render_table(report)
    assert "target colocated_tbt_at_least_3x" in table and "KV handoff, 16-token" in table


def test_missing_figures_are_not_met() -> None:
    empty = BenchRun(1.0, {}, {"colocated": ModeRun("colocated"),
                               "disaggregated": ModeRun("disaggregated")})  # fmt: skip
    report = interference_report(empty)
    assert all(v["met"] is False and v["value"] is None for v in report["targets"].values())
    assert report["processes"] == {"idle_cpu_cores": {}, "cpus_allowed": {}}
