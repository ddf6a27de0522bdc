"""bench/trace_replay.py as a real process on a small synthetic trace, and its bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.sim.traces import synthetic_shared_prefix

BENCH = Path(__file__).resolve().parents[2] / "bench" / "trace_replay.py"
SMALL = [
    "--nodes", "2", "--gpus", "3", "--prefill-nodes", "1", "--capacities", "8192,1e6",
    "--window-s", "30", "--scales", "0.5,1", "--bisect", "0", "--no-plots",
    "--parts", "hits,serving,locality,online",
]  # fmt: skip
HARDWARE = [
    "--window-s", "30", "--machines", "2", "--no-hw-search", "--bisect", "0",
    "--placement-gpus", "2", "--placement-window-s", "30", "--no-plots",
    "--parts", "hardware,placement",
]  # fmt: skip


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(BENCH), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def _write_trace(path: Path) -> None:
    load = synthetic_shared_prefix(60, rate=2.0, n_prefixes=3, prefix_blocks=4, seed=1)
    lines = [
        json.dumps(
            {
                "timestamp": int(r.arrival_s * 1000),
                "input_length": r.input_len,
                "output_length": 20,
                "hash_ids": list(r.blocks),
            }
        )
        for r in load.requests
    ]
    path.write_text("\n".join([*lines[:10], "{broken", *lines[10:]]) + "\n")


def test_bench_json_on_small_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    _write_trace(trace)
    proc = _bench("--trace", str(trace), "--json", *SMALL)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["trace"]["requests"], report["trace"]["skipped"]) == (60, 1)
    assert report["trace"]["first_errors"][0].startswith("line 11: ")
    row = report["hit_ratio"][1]  # 1M tokens: nothing is ever evicted
    assert row["global_lru"] == row["infinite"] > 0
    assert row["policies"]["random"]["pooled"]["hit"] == row["infinite"]
    serving = report["serving"]
    modes = {"colocated", "disaggregated", "conditional", "flexible"}
    assert set(serving["goodput"]) == modes
    assert set(serving["split_goodput"]) == {"0", "1", "2"}  # every split of 3 nodes
    rows = serving["planner"]
    assert [r["rate"] for r in rows] == [p["rate"] for p in serving["modes"]["flexible"]]
    for row in rows:  # the planner's choice is one of the splits, judged by simulation
        assert 0 <= row["chosen"] <= 2 and set(row["tried_on_observed"]) <= {"0", "1", "2"}
        assert row["best_fixed_attained"] == max(row["fixed"].values())
    targets = report["targets"]
    assert len(targets["flexible_ge_best_minus_0.01_at_every_load"]) == len(rows)
    assert len(targets["hit_vs_random_local"]) == 2
    loc = report["locality"]["rows"]  # 2 rates x (pooled, local) x 3 policies
    assert len(loc) == 12 and {r["cache"] for r in loc} == {"pooled", "local"}
    for r in loc:  # the TTFT parts add up to the mean TTFT
        parts = r["queue_s"] + sum(r["load_s"].values()) + r["compute_s"]
        assert parts == pytest.approx(r["mean_ttft_s"], rel=1e-6, abs=1e-9)
    assert not any(
        k.startswith("pooled") for r in loc if r["cache"] == "local" for k in r["load_s"]
    )
    shifts = report["online"]["scenarios"]
    assert [sc["name"] for sc in shifts] == ["lighter", "decode-heavy"]
    for sc in shifts:
        assert set(sc["static"]) == {"first", "second", "all"} == set(sc["online"])
    sweep = report["online"]["sweep"]  # 6 random mixes (seed 0), static vs online each
    assert (len(sweep["mixes"]), sweep["seed"]) == (6, 0)
    gaps = [m["online"]["all"] - m["static"]["all"] for m in sweep["mixes"]]
    assert sweep["worst_online_minus_static"] == min(gaps)
    never_worse = report["targets"]["online_ge_fixed_minus_0.01_on_every_mix"]
    assert never_worse == [g >= -0.01 for g in [
        sc["online"]["all"] - sc["static"]["all"] for sc in shifts] + gaps]  # fmt: skip
    fit = report["calibration"]["llama2-70b/a100-tp4"]
    assert fit["points"] > 0 and 0 < fit["decode_mean_rel_err"] < fit["decode_max_rel_err"]
    assert report["calibration"]["opt-13b/a100-tp1"] is None  # published coefficients only


def test_bench_hardware_and_placement(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    _write_trace(trace)
    proc = _bench("--trace", str(trace), "--json", *HARDWARE)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    hw = report["hardware"]
    names = [r["name"] for r in hw["rows"]]
    assert names[:3] == ["Baseline-A100", "Baseline-H100", "Splitwise-AA"]
    rows = {r["name"]: r for r in hw["rows"]}
    # costs and power from kvstore/data/hardware.csv: one H100 + one A100 machine
    assert rows["Splitwise-HA"]["cost_per_hour"] == pytest.approx(38.0 + 17.6)
    assert rows["Splitwise-HHcap"]["power_kw"] == pytest.approx(10.2 + 7.14)
    for r in hw["rows"]:
        assert r["per_cost"] == pytest.approx(r["goodput"] / r["cost_per_hour"])
    assert report["targets"]["paper"]["same_power_and_cost"] == 2.35
    pl = report["placement"]
    assert pl["placement"] == "1x prefill TP1 + 1x decode TP1"  # the only one in 2 GPUs
    assert pl["too_long"] > 0  # Azure prompts beyond OPT's 2048-token context, counted
    assert pl["goodput"] == pl["candidates"][pl["placement"]]


def test_bench_rejects_bad_inputs(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n")
    proc = _bench("--trace", str(bad), *SMALL)
    assert proc.returncode == 2
    assert "no valid request" in proc.stderr
    proc = _bench("--trace", str(bad), "--ttft-slo", "0")
    assert proc.returncode == 2 and "impossible objectives" in proc.stderr
    proc = _bench("--trace", str(bad), "--gpus", "1", "--prefill-nodes", "1")
    assert proc.returncode == 2 and "empty cluster" in proc.stderr


def _lengths_trace(path: Path, prompts: list[int]) -> None:
    """One request every 0.5 s with the given prompt lengths, 16-token answers."""
    lines, block = [], 0
    for i, n in enumerate(prompts):
        ids = list(range(block, block + -(-n // 512)))
        block += len(ids)
        lines.append(json.dumps({"timestamp": 500 * i, "input_length": n,
                                 "output_length": 16, "hash_ids": ids}))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


def test_bench_counts_requests_beyond_every_context_and_refuses_a_trace_of_them(
    tmp_path: Path,
) -> None:
    """OPT-13B serves 2,048 tokens: longer requests are rejected and counted; a trace of
    nothing else is refused with the count; an unknown hardware profile lists those known."""
    opt = ["--profile", "opt-13b/a100-tp1", "--gpus", "3", "--prefill-nodes", "1",
           "--window-s", "30", "--scales", "1", "--bisect", "0", "--no-plots",
           "--ttft-slo", "1", "--tbt-slo", "0.1", "--parts", "serving"]  # fmt: skip
    mixed = tmp_path / "mixed.jsonl"
    _lengths_trace(mixed, [3000 if i % 4 == 0 else 600 for i in range(40)])
    proc = _bench("--trace", str(mixed), "--json", *opt)
    assert proc.returncode == 0, proc.stderr
    serving = json.loads(proc.stdout)["serving"]
    assert (serving["requests"], serving["too_long"]) == (40, 10)
    for pts in serving["modes"].values():  # rejected, and so missed, in every mode
        assert all(p["rejected"] >= 10 and p["attained"] <= 0.75 for p in pts)
    too_long = tmp_path / "long.jsonl"
    _lengths_trace(too_long, [3000] * 8)
    proc = _bench("--trace", str(too_long), *opt)
    assert proc.returncode == 2
    assert "all 8 requests exceed every node's context (2048 tokens)" in proc.stderr
    proc = _bench("--trace", str(too_long), "--profile", "llama2-70b/b200-tp8")
    assert proc.returncode == 2 and "llama2-70b/a100-tp4" in proc.stderr  # the choices
