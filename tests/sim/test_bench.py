"""bench/trace_replay.py as a real process on a small synthetic trace, and its bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kvstore.sim.traces import synthetic_shared_prefix

BENCH = Path(__file__).resolve().parents[2] / "bench" / "trace_replay.py"
SMALL = [
    "--nodes", "2", "--gpus", "2", "--prefill-nodes", "1", "--capacities", "8192,1e6",
    "--window-s", "30", "--scales", "0.5,1", "--bisect", "1", "--no-plots",
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
    assert set(report["serving"]["goodput"]) == {"colocated", "disaggregated", "conditional"}
    assert len(report["targets"]["hit_vs_random_local"]) == 2
    fit = report["calibration"]["llama2-70b/a100-tp4"]
    assert fit["points"] > 0 and 0 < fit["decode_mean_rel_err"] < fit["decode_max_rel_err"]
    assert report["calibration"]["opt-13b/a100-tp1"] is None  # published coefficients only


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
