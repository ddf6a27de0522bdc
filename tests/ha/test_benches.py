"""bench/failover.py and bench/soak.py end to end at a tiny size (real etcd, processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ha.etcd import find_etcd

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(find_etcd() is None, reason="no etcd binary (apt-get install etcd-server)"),
]


def _bench(*argv: str, timeout_s: float) -> dict:
    proc = subprocess.run(
        [sys.executable, *argv, "--json"], capture_output=True, text=True, cwd=REPO,
        timeout=timeout_s,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_failover_bench_one_trial(tmp_path: Path) -> None:
    out = tmp_path / "failover.json"
    r = _bench("bench/failover.py", "--trials", "1", "--no-rates", "--out", str(out),
               timeout_s=240)  # fmt: skip
    assert r["objects_lost"] == 0 and r["untyped_errors"] == 0
    assert 0 <= r["writes_resume_p99_s"] < 10
    assert json.loads(out.read_text())["trials"] == 1


def test_soak_short(tmp_path: Path) -> None:
    """30 s at 3 clients: the soak's asserts but its slopes' (a 3-minute run cannot judge
    < 1 MiB/min either: docs/reliability.md, "bench/soak.py"; the 30-minute run does)."""
    out = tmp_path / "soak.json"
    r = _bench("bench/soak.py", "--seconds", "30", "--clients", "3", "--sample-s", "2",
               "--out", str(out), timeout_s=300)  # fmt: skip
    assert r["integrity_failures"] == 0 and r["untyped_errors"] == 0
    assert r["ops"]["put"] > 50 and r["verified"] > 0
    assert set(r["rss_slope_mib_per_min"]) >= {"master0", "master1", "master2", "etcd"}
    # the serving workload (on by default): one burst at 15 s, rejected in part with hints
    s = r["serving"]
    assert s["enabled"] and s["requests_ok"] > 0 and s["requests_failed"] == 0
    assert s["untyped_errors"] == 0 and s["token_mismatches"] == 0 and s["given_up"] == 0
    assert s["bursts"] == 1 and s["rejections"] > 0
    assert s["rejections_with_hint"] == s["rejections"]
    assert r["processes_died"] == []
    assert {"prefill", "decode", "conductor"} <= set(r["rss_slope_mib_per_min"])
    # the warm-up is the first quarter; the file holds the curves behind the slopes
    assert r["warmup_s"] == 7.5 and set(r["rss_anon_slope_mib_per_min"]) == set(
        r["rss_slope_mib_per_min"]
    )
    curves = json.loads(out.read_text())["rss_samples"]
    assert all(len(c) >= 10 and len(c[0]) == 3 for c in curves.values()), curves
