"""The soak's verdict on memory growth: a process's RSS slope after its warm-up.

A short run (bench/soak.py --ci: 3 minutes) cannot use a least-squares line through
every RSS sample: a healthy process's RSS is a sawtooth (a garbage collector's or an
allocator's cycle, a burst of requests' threads and buffers every 30 s, a Go runtime's
GC) and its start-up fills caches for tens of seconds, and over a 2-minute window
either moves the line by as much as the 1 MiB/min target. What is measured instead:

1. the warm-up is the first third of the run (`WARMUP_FRACTION`): 60 s of a 3-minute
   run, 600 s of a 30-minute one; nothing before it is fitted;
2. over the rest, the lower envelope: at each sample, the lowest sample of the window
   of a quarter of that span starting there (`WINDOW_FRACTION`: 30 s of a 3-minute
   run, one burst period; 300 s of a 30-minute one), i.e. what the process holds
   between two collections or bursts; a transient peak, however tall, does not count,
   and a sawtooth shorter than the window is flat;
3. the slope is the Theil-Sen estimate through that envelope: the median of the slopes
   between every pair of its points, so a stretch out of line (a drop when a cache is
   freed) moves it little.

Why it still catches a leak: a leak raises the troughs as much as the peaks, at its own
rate, so the envelope is the leak's line and the median pairwise slope of a line is its
slope. A +3 MiB/min leak under a 3 MiB sawtooth and 2.5 MiB bursts reads +3
(tests/bench_smoke/test_rss_slope.py, on synthetic series and on real processes). What
it gives up: a leak that only shows in the peaks (memory never freed between bursts
raises the troughs too, so none that lasts) and growth that stops before the warm-up
ends (a cache filling to its bound, which is not a leak). What it does not forgive: a
lasting step, e.g. an allocator keeping a new high water of 1.5 MiB in the middle of a
2-minute window, reads about +1 MiB/min: a process must reach its plateau within the
warm-up.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

WARMUP_FRACTION = 1 / 3
WINDOW_FRACTION = 1 / 4  # of the fitted span


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


def lower_envelope(
    points: Sequence[tuple[float, float]], start: float, end: float, width: float
) -> list[tuple[float, float]]:
    """For each sample at t in [start, end - width]: (t + width / 2, the lowest value of
    the samples in [t, t + width])."""
    inside = sorted((t, v) for t, v in points if start <= t <= end)
    out = []
    for i, (t, _) in enumerate(inside):
        if t > end - width:
            break
        low = min(v for u, v in inside[i:] if u <= t + width)
        out.append((t + width / 2, low))
    return out


def theil_sen_mib_per_min(points: Sequence[tuple[float, float]], min_dt: float = 0.0) -> float:
    """The median of the slopes between every pair of (seconds, MiB) points at least
    `min_dt` apart (and not at the same time), in MiB per minute; 0 without a pair."""
    slopes = [
        (v2 - v1) / (t2 - t1)
        for i, (t1, v1) in enumerate(points)
        for t2, v2 in points[i + 1 :]
        if abs(t2 - t1) >= min_dt and t2 != t1
    ]
    return 60 * statistics.median(slopes) if slopes else 0.0


def rss_slope_mib_per_min(points: Sequence[tuple[float, float]], seconds: float) -> float:
    """The soak's slope of one process's (seconds since start, MiB) samples over a run
    of `seconds`: Theil-Sen through the lower envelope after the warm-up (module doc)."""
    start = warmup_s(seconds)
    width = (seconds - start) * WINDOW_FRACTION
    # only pairs a window apart: the envelope is a staircase (one trough stays the
    # window's lowest until it leaves it), and the pairs on one stair, slope 0, would
    # pull the median of a leak's slopes towards 0
    return theil_sen_mib_per_min(lower_envelope(points, start, seconds, width), min_dt=width)
