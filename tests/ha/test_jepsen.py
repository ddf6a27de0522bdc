"""The Jepsen-style check in CI size: one run on emulated hosts (network namespaces)
with each fault once (partition of the leader, leader SIGKILL, clean handover), four
client processes on eight keys; every key's history must be linearizable.
`python bench/jepsen.py --runs 20` is the full check (randomized faults)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ha.etcd import find_etcd
from tests.ha.jepsen import run_once

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
    pytest.mark.skipif(find_etcd() is None, reason="no etcd binary (apt-get install etcd-server)"),
]


def test_histories_under_partition_kill_and_handover_are_linearizable(tmp_path: Path) -> None:
    r = run_once(tmp_path, seed=11, seconds=26, schedule=["partition", "kill", "handover"])
    assert [f["fault"] for f in r["faults"]][:3] == ["partition", "kill", "handover"], r
    for fault in r["faults"]:
        assert fault["new_epoch"] > fault["epoch"] and fault["new_leader_s"] < 10, fault
    assert r["client_exits"] == [0, 0, 0, 0], r
    assert r["violations"] == 0, "\n\n".join(r["explained"])
    assert r["unknown"] == 0, r  # every key's search finished
    out = r["outcomes"]
    # enough acknowledged ops of every kind for the check to mean something
    assert out.get("put:ok", 0) >= 10 and out.get("remove:ok", 0) >= 10, out
    assert out.get("get:ok", 0) >= 50, out
