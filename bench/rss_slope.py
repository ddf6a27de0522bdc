"""The soak's verdict on memory growth: a process's RSS slope after its warm-up.

A least-squares line through a short run's RSS samples (bench/soak.py --ci: 3 minutes)
is moved by what is not growth: a healthy process's RSS is a sawtooth (a garbage
collector's or an allocator's cycle, a Go runtime's GC: etcd's RSS swings +-1.5 MiB
every few seconds), a burst of requests every 30 s raises it for a few seconds, and
one sample far out (a drop when a cache is freed, a spike) weighs on the line as the
square of its distance. What is measured instead:

1. the warm-up is the first third of the run (`WARMUP_FRACTION`): 60 s of a 3-minute
   run, 600 s of a 30-minute one; nothing before it is fitted (start-up fills the
   processes' caches, etcd's raft log and the allocators' arenas for 40-60 s);
2. the slope is the Theil-Sen estimate through every sample after it: the median of
   the slopes between every pair of samples, in MiB/min. Samples out of line (spikes
   of a burst, dips of a collection) move a median little, up to ~29% of them.

Why it still catches a leak: a leak raises RSS at its own rate all through the window,
so most pairs of samples have about its slope and the median is it: a +3 MiB/min leak
under a 3 MiB sawtooth and 2.5 MiB bursts reads +2.9 to +3.1, +8 reads +7.9 to +8.1
(tests/bench_smoke/test_rss_slope.py, on synthetic series and on real processes).
What it forgives: growth that ends before the warm-up (a cache filling to its bound),
and a lone step (an allocator keeping a new high water of ~1 MiB once in the window
reads ~0.5-0.8 MiB/min: the pairs on either side of the step are flat). What it can
miss: a leak in a window where the process also frees a lasting block (a drop of
6 MiB halfway through a +3 MiB/min leak reads below 0): the curves are kept in the
soak's JSON, and the 30-minute run fits ten times as much.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

WARMUP_FRACTION = 1 / 3


def rss_mib(pid: int, field: str = "VmRSS") -> float | None:
    """A process's resident set (or another /proc/PID/status field, e.g. RssAnon), MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def warmup_s(seconds: float) -> float:
    """The part of a run of `seconds` that is not fitted."""
    return seconds * WARMUP_FRACTION


def least_squares_mib_per_min(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute (0 with < 3)."""
    if len(points) < 3:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return 60 * sum((t - mx) * (v - my) for t, v in points) / var if var else 0.0


def theil_sen_mib_per_min(points: Sequence[tuple[float, float]]) -> float:
    """The median of the slopes between every pair of (seconds, MiB) points (not at the
    same time), in MiB per minute; 0 without a pair."""
    slopes = [
        (v2 - v1) / (t2 - t1)
        for i, (t1, v1) in enumerate(points)
        for t2, v2 in points[i + 1 :]
        if t2 != t1
    ]
    return 60 * statistics.median(slopes) if slopes else 0.0


def rss_slope_mib_per_min(points: Sequence[tuple[float, float]], seconds: float) -> float:
    """The soak's slope of one process's (seconds since start, MiB) samples over a run
    of `seconds`: Theil-Sen through the samples after the warm-up (module doc)."""
    start = warmup_s(seconds)
    return theil_sen_mib_per_min([(t, v) for t, v in points if t >= start])
