"""Latency figures of a simulation: percentiles, SLO attainment and goodput.

Goodput follows DistServe (OSDI'24): the highest request rate at which at least 90% of
requests meet both the TTFT and the TBT (time per output token) objective. A rejected or
unfinished request misses its objectives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kvstore.errors import BadRequestError
from kvstore.sim.replay import Outcome, Slo

GOODPUT_ATTAINMENT = 0.9


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Percentiles (seconds) of TTFT and TBT over finished requests, and SLO attainment."""

    n: int
    finished: int
    rejected: int
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    tbt_p50: float
    tbt_p90: float
    tbt_p99: float
    ttft_attained: float
    tbt_attained: float
    attained: float


def _pct(vals: list[float], q: float) -> float:
    return float(np.percentile(vals, q)) if vals else float("nan")


def meets(o: Outcome, slo: Slo) -> tuple[bool, bool]:
    """Whether one request met its TTFT and its TBT objective."""
    ttft_ok = o.ttft_s is not None and o.ttft_s <= slo.ttft_s
    tbt_ok = o.tbt_s is not None and o.tbt_s <= slo.tbt_s
    return ttft_ok, tbt_ok


def summarize(outcomes: Sequence[Outcome], slo: Slo) -> LatencySummary:
    """Percentiles and attainment of one run; BadRequestError on an empty run."""
    if not outcomes:
        raise BadRequestError("no outcomes to summarize")
    ttft = [o.ttft_s for o in outcomes if o.ttft_s is not None]
    tbt = [o.tbt_s for o in outcomes if o.tbt_s is not None]
    flags = [meets(o, slo) for o in outcomes]
    n = len(outcomes)
    return LatencySummary(
        n=n,
        finished=len(tbt),
        rejected=sum(o.rejected for o in outcomes),
        ttft_p50=_pct(ttft, 50),
        ttft_p90=_pct(ttft, 90),
        ttft_p99=_pct(ttft, 99),
        tbt_p50=_pct(tbt, 50),
        tbt_p90=_pct(tbt, 90),
        tbt_p99=_pct(tbt, 99),
        ttft_attained=sum(a for a, _ in flags) / n,
        tbt_attained=sum(b for _, b in flags) / n,
        attained=sum(a and b for a, b in flags) / n,
    )


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One load point of a sweep: offered request rate and what it achieved."""

    rate: float
    summary: LatencySummary


def sweep(rates: Sequence[float], run: Callable[[float], LatencySummary]) -> list[SweepPoint]:
    """Run `run(rate)` at each rate (ascending)."""
    if not rates or any(r <= 0 for r in rates):
        raise BadRequestError(f"sweep needs positive rates, got {list(rates)}")
    return [SweepPoint(r, run(r)) for r in sorted(rates)]


def goodput(points: Sequence[SweepPoint], target: float = GOODPUT_ATTAINMENT) -> float:
    """Highest swept rate such that it and every lower rate attain >= `target` (0 if none)."""
    best = 0.0
    for p in sorted(points, key=lambda p: p.rate):
        if p.summary.attained < target:
            break
        best = p.rate
    return best


def refine_goodput(
    points: Sequence[SweepPoint],
    run: Callable[[float], LatencySummary],
    iters: int,
    target: float = GOODPUT_ATTAINMENT,
) -> list[SweepPoint]:
    """Bisect `iters` times between the goodput point and the next (failing) swept rate.

    Returns the extra points measured; `goodput(points + extra)` is then finer. No extra run
    when every point passes or the lowest one already fails.
    """
    pts = sorted(points, key=lambda p: p.rate)
    lo = goodput(pts, target)
    above = [p.rate for p in pts if p.rate > lo]
    if lo == 0.0 or not above:
        return []
    hi, extra = above[0], []
    for _ in range(iters):
        mid = (lo + hi) / 2
        p = SweepPoint(mid, run(mid))
        extra.append(p)
        lo, hi = (mid, hi) if p.summary.attained >= target else (lo, mid)
    return extra
