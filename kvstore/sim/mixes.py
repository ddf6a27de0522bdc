"""Shifting mixes for the online role balancer: one kind of traffic, then another.

A mix is two phases of `half_s` seconds each. `random_mixes` draws them from source
traces (seeded): each phase is a window of a source at a random start, its outputs
stretched by a random factor (log-uniform in `output_range`) and its arrivals scaled so
that its offered work is a random share (uniform in `load_range`) of what the pool can
do by the planner's demand model (`kvstore.conductor.planner.demand`: busy prefill nodes
plus busy decode nodes at the largest batch within the TBT objective). Loads are drawn
relative to the pool, not to any trace's own rate, so the same draw means the same
pressure on any trace and any profile.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

from kvstore.conductor.planner import ObservedLoad, demand
from kvstore.errors import BadRequestError
from kvstore.sim.replay import Slo, to_request
from kvstore.sim.search import Pool
from kvstore.sim.traces import TraceLoad, TraceRequest, scale_rate, window


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of a mix: where its requests come from and how hard they push."""

    source: str
    start_s: float  # of the source trace
    rate_factor: float  # arrivals this many times the source's
    output_factor: float  # outputs this many times the source's
    load: float  # offered work / the pool's nodes (demand model)
    requests: int


@dataclass(frozen=True, slots=True)
class ShiftingMix:
    """`first` for `half_s` seconds, then `second`; `cut` = requests of the first phase."""

    name: str
    first: Phase
    second: Phase
    load: TraceLoad
    cut: int
    half_s: float


def shifted_mix(first: TraceLoad, second: TraceLoad, at_s: float) -> TraceLoad:
    """`first`'s requests, then `second`'s from `at_s` on (block ids moved past first's)."""
    offset = 1 + max((b for r in first.requests for b in r.blocks), default=0)
    reqs = list(first.requests)
    for r in second.requests:
        blocks = tuple(b + offset for b in r.blocks)
        reqs.append(TraceRequest(len(reqs), r.arrival_s + at_s, r.input_len, r.output_len, blocks))
    return TraceLoad(tuple(reqs))


def demand_share(load: TraceLoad, length_s: float, pool: Pool, slo: Slo) -> float:
    """Busy prefill + decode nodes `load` needs over `length_s`, as a share of the pool."""
    reqs = [to_request(r, slo) for r in load.requests]
    need = demand(ObservedLoad.from_requests(reqs, length_s), pool.latency, slo.tbt_s,
                  pool.kv_capacity_tokens)  # fmt: skip
    return (need.prefill_nodes + need.decode_nodes) / pool.total


def _phase(
    rng: random.Random,
    sources: Mapping[str, TraceLoad],
    half_s: float,
    pool: Pool,
    slo: Slo,
    load_range: tuple[float, float],
    output_range: tuple[float, float],
) -> tuple[Phase, TraceLoad]:
    name = rng.choice(sorted(sources))
    src = sources[name]
    out_f = math.exp(rng.uniform(*map(math.log, output_range)))
    share = rng.uniform(*load_range)
    span = max(src.duration_s - half_s, 0.0)
    start = rng.uniform(0.0, span)
    for _ in range(8):  # a window with requests in it (sparse traces: try another start)
        base = window(src, start, half_s)
        if len(base.requests) >= 2:
            break
        start = rng.uniform(0.0, span)
    else:
        raise BadRequestError(f"source {name!r}: no {half_s:g} s window with requests")
    stretch = TraceLoad(tuple(replace(r, output_len=max(1, round(r.output_len * out_f)))
                              for r in base.requests))  # fmt: skip
    factor = share / demand_share(stretch, half_s, pool, slo)
    # the same span of arrivals at `factor` x the rate: take factor x half_s of the source
    start = min(start, max(src.duration_s - half_s * factor, 0.0))
    wide = window(src, start, half_s * factor)
    wide = TraceLoad(tuple(replace(r, output_len=max(1, round(r.output_len * out_f)))
                           for r in wide.requests))  # fmt: skip
    load = window(scale_rate(wide, factor), 0.0, half_s)
    got = demand_share(load, half_s, pool, slo) if load.requests else 0.0
    return Phase(name, start, factor, out_f, got, len(load.requests)), load


def random_mixes(
    sources: Mapping[str, TraceLoad],
    n: int,
    half_s: float,
    pool: Pool,
    slo: Slo,
    *,
    seed: int = 0,
    load_range: tuple[float, float] = (0.4, 1.4),
    output_range: tuple[float, float] = (0.5, 4.0),
) -> list[ShiftingMix]:
    """`n` seeded mixes of two phases each drawn from `sources` (see module doc)."""
    if not sources or n < 1 or not half_s > 0:
        raise BadRequestError("random_mixes needs sources, n >= 1 and half_s > 0")
    if not 0 < load_range[0] <= load_range[1] or not 0 < output_range[0] <= output_range[1]:
        raise BadRequestError(f"bad ranges: load {load_range}, output {output_range}")
    rng = random.Random(seed)
    mixes = []
    for i in range(n):
        draw = (rng, sources, half_s, pool, slo, load_range, output_range)
        first, a = _phase(*draw)
        second, b = _phase(*draw)
        mixes.append(ShiftingMix(f"mix {i}", first, second, shifted_mix(a, b, half_s),
                                 len(a.requests), half_s))  # fmt: skip
    return mixes
