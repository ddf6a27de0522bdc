"""bench/mooncake_side_by_side.py's harness run with `--in-call` (bench/store_timer.py):
Mooncake's own store_kv_bench against a real `kvstore master`, the store's calls timed
inside the harness process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from mooncake_side_by_side import HARNESS, ceiling, kvstore_pool, run_harness  # noqa: E402

MiB = 1 << 20


@pytest.mark.timeout(120)
def test_the_store_calls_are_timed_inside_the_harness(tmp_path: Path) -> None:
    objects, size = 16, MiB
    segment = size * objects * 5 // 4 + 64 * MiB
    with kvstore_pool(segment, False, tmp_path / "kvstore.log") as master:
        run = run_harness(
            HARNESS, "kvstore.compat.mooncake", master, size, objects, segment,
            {"KVSTORE_TRANSPORT": "auto"}, tmp_path, in_call=True,
        )  # fmt: skip
    assert run.ok and run.write_mib_s > 0 and run.read_mib_s > 0
    # every call was seen, and a call is part of the harness's request around it
    assert 0 < run.write_call_us < run.write_op_us
    assert 0 < run.read_call_us < run.read_op_us
    (times,) = tmp_path.glob("times-*.json")  # written by the harness process at exit
    calls = json.loads(times.read_text())
    assert calls["put"][0] == objects and calls["get"][0] == objects


def test_ceiling() -> None:
    assert ceiling(1000.0, 600.0) == pytest.approx(2.5)  # 1000 / (1000 - 600)
    assert ceiling(1000.0, 0.0) == 0.0  # not measured
    assert ceiling(500.0, 500.0) == 0.0  # no harness time left: unbounded, not reported
