"""How busy the host's CPUs were with work that is not ours, over a phase.

Also: each of our processes' own CPU use over an interval (an idle node that spins
steals its core from the node under test) and the cores a process may run on.

A shared machine's other tenants steal cycles from pinned nodes and inflate tail
latencies; a benchmark that reports p99 should report that load next to it.
Reads /proc/stat (all CPUs' busy time) and /proc/<pid>/stat (our processes'
user + system time); the difference is everyone else's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

TICK = os.sysconf("SC_CLK_TCK")


def busy_ticks() -> int:
    """Busy ticks of all CPUs since boot (everything but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    guest = sum(fields[8:10]) if len(fields) > 9 else 0  # already counted in user/nice
    return sum(fields) - idle - guest


def process_ticks(pids: Iterable[int]) -> int:
    """User + system ticks of the given live processes (all their threads)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += int(rest[11]) + int(rest[12])  # utime, stime (fields 14, 15)
    return total


class ForeignLoad:
    """CPU used by other processes over an interval, in cores (0..ncpu)."""

    def __init__(self, our_pids: Callable[[], list[int]]) -> None:
        self.our_pids = our_pids
        self._start: tuple[float, int, int] | None = None

    def start(self) -> None:
        self._start = (time.monotonic(), busy_ticks(), process_ticks(self.our_pids()))

    def stop(self) -> float:
        if self._start is None:
            raise RuntimeError("ForeignLoad.stop() before start()")
        t0, busy0, ours0 = self._start
        seconds = time.monotonic() - t0
        busy = busy_ticks() - busy0
        ours = process_ticks(self.our_pids()) - ours0
        self._start = None
        return max(busy - ours, 0) / TICK / max(seconds, 1e-9)


class ProcessLoad:
    """CPU used by each named process over an interval, in cores."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self._start: tuple[float, dict[str, int]] | None = None

    def _ticks(self) -> dict[str, int]:
        return {name: process_ticks([pid]) for name, pid in self.pids.items()}

    def start(self) -> None:
        self._start = (time.monotonic(), self._ticks())

    def stop(self) -> dict[str, float]:
        if self._start is None:
            raise RuntimeError("ProcessLoad.stop() before start()")
        t0, before = self._start
        seconds = max(time.monotonic() - t0, 1e-9)
        after = self._ticks()
        self._start = None
        return {n: round(max(after[n] - before[n], 0) / TICK / seconds, 3) for n in self.pids}


def cpus_allowed(pid: int) -> str:
    """The Cpus_allowed_list of a process's main thread, e.g. "0" or "0-1"."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    raise RuntimeError(f"no Cpus_allowed_list for pid {pid}")
