"""Host CPU accounting from /proc with a real busy child process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvstore.serving_bench.hostload import TICK, ForeignLoad, busy_ticks, process_ticks

SPIN = (
    "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"
    "print('spun', flush=True)\ninput()\n"
)


def test_a_busy_child_shows_in_its_ticks_and_the_hosts() -> None:
    host0 = busy_ticks()
    child = subprocess.Popen(
        [sys.executable, "-c", SPIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "spun\n"
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
