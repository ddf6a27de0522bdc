"""Smoke tests: the interference bench (--quick --json) and the cluster demo run end to
end as subprocesses, on real node processes, at a tiny size, and report sane figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PHASES = ("stream", "burst", "light")
TARGETS = {
    "disagg_tbt_within_1.5x",
    "colocated_tbt_at_least_3x",
    "kv_transfer_under_10pct",
    "colocated_wins_light_ttft",
}


def _run(*argv: str, timeout_s: float) -> str:
    proc = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, cwd=REPO, timeout=timeout_s
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_interference_quick_json() -> None:
    # tiny model, schedules at twice the nominal rate: the plumbing, not the figures
    out = _run("bench/interference.py", "--quick", "--json", "--model", "tiny",
               "--slowdown", "0.5", timeout_s=140)  # fmt: skip
    report = json.loads(out)
    for mode in ("colocated", "disaggregated"):
        for phase in PHASES:
            fig = report[mode][phase]
            assert fig["requests"] > 0 and fig["failed"] == 0, (mode, phase, fig)
            assert 0 < fig["ttft_ms"]["p50"] <= fig["ttft_ms"]["p99"]
            assert 0 <= fig["tbt_ms"]["p50"] <= fig["tbt_ms"]["p99"] <= fig["tbt_ms"]["max"]
            assert fig["tbt_ms"]["n"] > fig["requests"]
        assert report[mode]["burst_prompts"]["requests"] > 0
        assert set(report[mode]["foreign_cpu_cores"]) == set(PHASES)
        assert report[mode]["burst_prefill_ms"]["p50"] > 0
    dis = report["disaggregated"]
    assert dis["burst_prompts"]["kv_bytes"] > 0
    assert 0 < dis["burst_prompts"]["kv_fraction"]["p50"] < 1
    assert dis["light"]["handoff_ms"]["n"] == dis["light"]["requests"]
    assert report["colocated"]["burst_prompts"]["kv_bytes"] == 0
    assert set(report["targets"]) == TARGETS
    assert all(isinstance(v["met"], bool) for v in report["targets"].values())
    assert report["slowdown"]["applied"] == 0.5
    assert report["config"]["process_trouble"] == []


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_cluster_demo_small() -> None:
    out = _run("-m", "cli.cluster_demo", "--conversations", "2", "--turns", "3",
               "--system-tokens", "64", "--user-tokens", "32", "--reply-tokens", "4",
               "--no-progress", timeout_s=80)  # fmt: skip
    assert "6/6 ok" in out, out
    assert "shutdown: clean; 0 shared-memory segments left" in out, out
    hits = next(line for line in out.splitlines() if line.startswith("prefix hits:"))
    later = hits.split("turns after the first: ")[1]
    cached, prompt = (int(x) for x in later.split()[0].split("/"))
    # turn 2 of a chat re-reads at least the system prompt + turn 1 (full blocks)
    assert prompt > 0 and cached >= 2 * 64
    assert "DRAM" in out and "bytes moved: prefill -> pool" in out
