"""bench/failover.py end to end at a tiny size, bench/soak.py's 5-minute run with its
targets (real etcd, processes)."""

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


@pytest.mark.timeout(600)
def test_soak_5_minutes(tmp_path: Path) -> None:
    """bench/soak.py --ci (8 clients and the serving workload, 300 s) with every target of
    issue 11 asserted: each process's RSS slope after the warm-up (the first 100 s) <
    1 MiB/min (Theil-Sen, bench/rss_slope.py; a master that took over after it, and
    etcd then, are not judged), 0 integrity failures, every rejection with a hint, no
    untyped error, no process died."""
    out = tmp_path / "soak.json"
    r = _bench("bench/soak.py", "--ci", "--out", str(out), timeout_s=570)
    assert r["integrity_failures"] == 0 and r["untyped_errors"] == 0
    assert r["ops"]["put"] > 5000 and r["verified"] > 1000
    if not r["leader_elections"]:  # (a new leader counts evictions from its takeover)
        # every key missing at the end, or found gone while running, was evicted: the
        # master's count covers them (it also counts the serving workload's KV blocks
        # and puts whose outcome the client never learnt, so it may be larger: CI's run
        # of 8988877 read 487,911 missing + 0 against 488,043 evictions)
        assert r["evicted"] + r["evicted_while_running"] <= r["evictions"]
    s = r["serving"]
    assert s["enabled"] and s["requests_ok"] > 0 and s["requests_failed"] == 0
    assert s["untyped_errors"] == 0 and s["token_mismatches"] == 0 and s["given_up"] == 0
    # a burst every 30 s from 15 s on, each waiting for its requests: 10 when every burst
    # ends within 30 s, fewer when they take longer (CI runs have read 6 and 10)
    most = int((r["seconds"] - s["burst_every_s"] / 2) // s["burst_every_s"]) + 1
    assert 3 <= s["bursts"] <= most and s["rejections"] > 0, (s["bursts"], most)
    assert s["rejections_with_hint"] == s["rejections"] and s["hint_metadata_mismatch"] == 0
    assert r["processes_died"] == []
    slopes = r["rss_slope_mib_per_min"]
    names = {"master0", "master1", "master2", "n0", "n1", "n2", "etcd", "prefill", "decode"}
    assert names | {"conductor", "clients"} <= set(slopes)
    assert r["warmup_s"] == 100.0 and r["target_slope_mib_per_min"] == 1.0
    judged = {k: v for k, v in slopes.items() if k not in r["rss_slope_not_judged"]}
    assert {"clients", "conductor", "prefill", "decode", "n0", "n1", "n2"} <= set(judged)
    if not r["leader_elections"]:  # no takeover: etcd served no index load, it is judged
        assert "etcd" in judged
    # every judged process, etcd included (on this 2-core CI host, alone, etcd read
    # +0.07 / +0.13: its Go heap settles within ~30 s; only under a load of 10+ from
    # other work did its start-up run past the first minute and read +1.0 to +1.2)
    print("RSS slopes, MiB/min:", {k: round(v, 2) for k, v in judged.items()})
    assert max(judged.values()) < 1.0, (slopes, r["rss_slope_not_judged"])
    curves = json.loads(out.read_text())["rss_samples"]
    assert all(len(c) >= 60 and len(c[0]) == 3 for c in curves.values()), curves
