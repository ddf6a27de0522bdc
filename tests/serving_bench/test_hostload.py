"""Host CPU accounting from /proc with a real busy child process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvstore.serving_bench.hostload import (
    TICK,
    ForeignLoad,
    ProcessLoad,
    busy_ticks,
    cpus_allowed,
    process_ticks,
)

SPIN = (
    "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"
    "print('spun', flush=True)\ninput()\n"
)


def test_a_busy_child_shows_in_its_ticks_and_the_hosts() -> None:
    host0 = busy_ticks()
    child = subprocess.Popen(
        [sys.executable, "-c", SPIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    load = ProcessLoad({"child": child.pid})
    load.start()
    try:
        assert child.stdout is not None and child.stdout.readline() == "spun\n"
        assert load.stop()["child"] > 0.0  # it spun during the interval
        seen = process_ticks([child.pid])
        assert 0.55 * TICK <= seen <= 2.0 * TICK  # 0.6 s of CPU, plus interpreter start-up
        assert busy_ticks() - host0 >= 0.3 * TICK  # the host saw (most of) it too
    finally:
        child.communicate("\n", timeout=30)
    assert process_ticks([child.pid]) == 0  # gone: counts nothing


def test_foreign_load_needs_start() -> None:
    meter = ForeignLoad(lambda: [])
    with pytest.raises(RuntimeError):
        meter.stop()
    meter.start()
    assert meter.stop() >= 0.0


def test_process_load_of_an_idle_child_and_its_affinity() -> None:
    cpu = min(os.sched_getaffinity(0))
    code = f"import os; os.sched_setaffinity(0, {{{cpu}}}); print(1, flush=True); input()"
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "1\n"
        assert cpus_allowed(child.pid) == str(cpu)
        load = ProcessLoad({"idle": child.pid})
        with pytest.raises(RuntimeError):
            load.stop()
        load.start()
        # the child blocks in input(): it spends no CPU over the interval
        assert load.stop() == {"idle": 0.0}
    finally:
        child.communicate("\n", timeout=30)
