"""The Jepsen-style check in CI size: two runs on emulated hosts (network namespaces),
one with each fault once (partition of the leader, leader SIGKILL, clean handover), one
with faults drawn at random; four client processes on eight keys; every key's history
must be linearizable.
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


@pytest.mark.parametrize(
    ("seed", "schedule"),
    [(11, ["partition", "kill", "handover"]), (12, None)],
    ids=["each", "random"],
)
def test_histories_under_partition_kill_and_handover_are_linearizable(
    tmp_path: Path, seed: int, schedule: list[str] | None
) -> None:
    r = run_once(tmp_path, seed=seed, seconds=26, schedule=schedule)
    if schedule:
        assert [f["fault"] for f in r["faults"]][:3] == schedule, r
    assert len(r["faults"]) >= (3 if schedule else 2), r
    for fault in r["faults"]:
        assert fault["new_epoch"] > fault["epoch"] and fault["new_leader_s"] < 10, fault
    assert r["client_exits"] == [0, 0, 0, 0], r
    assert r["violations"] == 0, "\n\n".join(r["explained"])
    assert r["unknown"] == 0, r  # every key's search finished
    out = r["outcomes"]
    # enough acknowledged ops of every kind for the check to mean something
    assert out.get("put:ok", 0) >= 10 and out.get("remove:ok", 0) >= 10, out
    assert out.get("get:ok", 0) >= 50, out
