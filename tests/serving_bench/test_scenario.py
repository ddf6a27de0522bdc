"""Benchmark phase plans: slow-down, rounds and light blocks, exact schedules."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvstore.errors import BadRequestError, UnavailableError
from kvstore.serving_bench.scenario import BenchSizes, Clusters, check_pinning
from kvstore.serving_bench.workload import MixSpec

HEAVY = MixSpec(duration_s=4.0, stream_every_s=1.0, stream_prompt=8, stream_tokens=4,
                burst_every_s=2.0, burst_size=2, burst_prompt=32, first_burst_s=0.5,
                jitter=0.0)  # fmt: skip
LIGHT = MixSpec(duration_s=4.0, stream_every_s=0.5, stream_prompt=16, stream_tokens=2,
                jitter=0.0, seed=1)  # fmt: skip


def _sizes() -> BenchSizes:
    return BenchSizes("tiny", HEAVY, LIGHT, long_prompt=64, long_count=2)


def test_slowdown_stretches_times_and_keeps_counts() -> None:
    plan = _sizes().phases(2.0)
    assert [a.at_s for a in plan["stream"]] == [0.0, 2.0, 4.0, 6.0]
    bursts = [(a.at_s, a.request_id) for a in plan["burst"] if a.kind == "burst"]
    assert bursts == [(1.0, "b0.0"), (1.0, "b0.1"), (5.0, "b1.0"), (5.0, "b1.1")]


def test_rounds_split_the_duration_with_fresh_prompts() -> None:
    first, second = (_sizes().phases(1.0, r, rounds=2) for r in (0, 1))
    assert [a.at_s for a in first["stream"]] == [0.0, 1.0]
    assert [a.at_s for a in second["stream"]] == [0.0, 1.0]
    assert not {a.prompt for a in first["burst"]} & {a.prompt for a in second["burst"]}
    with pytest.raises(BadRequestError):
        _sizes().phases(1.0, 2, rounds=2)


def test_light_blocks_and_probes() -> None:
    sizes = _sizes()
    blocks = sizes.light_blocks(1.0, 4)
    assert [[a.at_s for a in b] for b in blocks] == [[0.0, 0.5]] * 4
    assert len({a.prompt for b in blocks for a in b}) == 8
    probe = sizes.long_probe()
    assert [(a.request_id, len(a.prompt), a.kind) for a in probe] == [
        ("long0", 64, "long"), ("long1", 64, "long"),
    ]  # fmt: skip
    warm = sizes.warmup(2, seed=0)
    assert [len(a.prompt) for a in warm] == [256, 256]
    assert warm != sizes.warmup(2, seed=1)


def test_bad_sizes() -> None:
    with pytest.raises(BadRequestError):
        BenchSizes("tiny", HEAVY.without_bursts(), LIGHT, long_prompt=64, long_count=1)
    with pytest.raises(BadRequestError):
        BenchSizes("tiny", HEAVY, LIGHT, long_prompt=64, long_count=1, max_slowdown=0.5)
    with pytest.raises(BadRequestError):
        BenchSizes("tiny", HEAVY, LIGHT, long_prompt=64, long_count=1, min_slowdown=0.0)
    with pytest.raises(BadRequestError):
        BenchSizes("tiny", HEAVY, LIGHT, long_prompt=64, long_count=1, idle_probe_s=0.0)


def test_pinning_is_read_back_from_proc() -> None:
    cpu = min(os.sched_getaffinity(0))
    code = f"import os; os.sched_setaffinity(0, {{{cpu}}}); print(1, flush=True); input()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "1\n"
        ok = Clusters(("a", "b"), "p", "d", {"prefill": str(cpu)})
        assert check_pinning(ok, {"prefill": child.pid}) == {"prefill": str(cpu)}
        wrong = Clusters(("a", "b"), "p", "d", {"prefill": str(cpu), "decode": str(cpu)})
        with pytest.raises(UnavailableError, match="not pinned"):
            check_pinning(wrong, {"prefill": child.pid})  # decode: no such process
    finally:
        child.communicate("\n", timeout=30)
