"""bench/failover.py end to end at a tiny size, bench/soak.py's 3-minute run with its
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


ETCD_GROSS_MIB_PER_MIN = 4.0


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


@pytest.mark.timeout(480)
def test_soak_3_minutes(tmp_path: Path) -> None:
    """bench/soak.py --ci (8 clients and the serving workload, 180 s) with every target of
    issue 11 asserted: each process's RSS slope after the warm-up (the first minute) <
    1 MiB/min (Theil-Sen, bench/rss_slope.py; a master that took over after it, and
    etcd then, are not judged), 0 integrity failures, every rejection with a hint, no
    untyped error, no process died."""
    out = tmp_path / "soak.json"
    r = _bench("bench/soak.py", "--ci", "--out", str(out), timeout_s=450)
    assert r["integrity_failures"] == 0 and r["untyped_errors"] == 0
    assert r["ops"]["put"] > 5000 and r["verified"] > 1000
    if not r["leader_elections"]:  # (a new leader counts evictions from its takeover)
        assert r["evicted"] == r["evictions"]  # every key missing at the end was evicted
    s = r["serving"]
    assert s["enabled"] and s["requests_ok"] > 0 and s["requests_failed"] == 0
    assert s["untyped_errors"] == 0 and s["token_mismatches"] == 0 and s["given_up"] == 0
    assert s["bursts"] == 6 and s["rejections"] > 0
    assert s["rejections_with_hint"] == s["rejections"] and s["hint_metadata_mismatch"] == 0
    assert r["processes_died"] == []
    slopes = r["rss_slope_mib_per_min"]
    names = {"master0", "master1", "master2", "n0", "n1", "n2", "etcd", "prefill", "decode"}
    assert names | {"conductor", "clients"} <= set(slopes)
    assert r["warmup_s"] == 60.0 and r["target_slope_mib_per_min"] == 1.0
    judged = {k: v for k, v in slopes.items() if k not in r["rss_slope_not_judged"]}
    assert {"clients", "conductor", "prefill", "decode", "n0", "n1", "n2"} <= set(judged)
    # kvstore's processes (and this driver): the target. etcd: only a gross leak (its
    # raft log without the flags of tests/ha/etcd.py read +15 to +17), because under
    # a load of 10+ its start-up runs past the first minute and its GC swings 2-3 MiB
    # (+1.19 in one such run): its < 1 is the 30-minute run's verdict
    ours = {k: v for k, v in judged.items() if k != "etcd"}
    assert max(ours.values()) < 1.0, (slopes, r["rss_slope_not_judged"])
    assert judged.get("etcd", 0.0) < ETCD_GROSS_MIB_PER_MIN, slopes
    curves = json.loads(out.read_text())["rss_samples"]
    assert all(len(c) >= 60 and len(c[0]) == 3 for c in curves.values()), curves
