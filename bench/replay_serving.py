"""trace_replay's serving parts: modes and splits per load, the planner, cache locality,
online role flips. Each function takes the parsed arguments and returns plain dicts
(the report's JSON); `trace_replay.py` prints and plots them."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, replace

from kvstore.conductor.planner import SplitChoice
from kvstore.conductor.profiles import data_dir, load_profile
from kvstore.conductor.roles import BalancerConfig, RoleBalancer
from kvstore.errors import BadRequestError
from kvstore.sim.cache import TierCapacity, blocks_for_tokens
from kvstore.sim.metrics import (
    GOODPUT_ATTAINMENT,
    LatencySummary,
    SweepPoint,
    refine_goodput,
    summarize,
)
from kvstore.sim.metrics import goodput as goodput_of
from kvstore.sim.mixes import random_mixes, shifted_mix
from kvstore.sim.replay import Outcome, Slo, split_too_long
from kvstore.sim.search import (
    Pool,
    balancer_control,
    horizon_windows,
    plan_split,
    run_split,
    split_specs,
)
from kvstore.sim.traces import TraceLoad, read_trace, scale_rate, window

KV_TOKENS_PER_NODE = 480_000  # (4 x 80 GB - 140 GB weights) * 0.9 / 320 KiB per token
MODES = ("colocated", "disaggregated", "conditional", "flexible")
LOCALITY_POLICIES = ("cache_load", "prefix_only", "least_loaded")


def make_pool(args: argparse.Namespace, pooled: bool = True) -> Pool:
    prof = load_profile(args.profile)
    cap = TierCapacity(blocks_for_tokens(int(args.serve_pool_tokens)) // args.gpus)
    ctx = prof.max_context_tokens
    return Pool(args.gpus, cap, KV_TOKENS_PER_NODE, prof.latency, prof.transfer, pooled, ctx)


class Windows:
    """The serving window and, never judged, what the planner observes: the next runs of
    as many requests as the serving window holds (`horizon_windows`)."""

    def __init__(self, load: TraceLoad, args: argparse.Namespace) -> None:
        self.length = args.window_s
        self.serve = window(load, 0.0, args.window_s)
        if not self.serve.requests:
            raise BadRequestError(f"no request in the first {args.window_s} s of the trace")
        self.load, self.count, self.windows = load, len(self.serve.requests), args.planner_windows
        # the planner sees the requests after the serving window (other requests, the same
        # kind of traffic); a trace too short for them falls back to the serving window
        self.own_window = not horizon_windows(load, self.length, self.count, 1, 1.0)
        self.base_rate = self.count / args.window_s

    def at(self, rate: float) -> TraceLoad:
        return scale_rate(self.serve, rate / self.base_rate)

    def observed_at(self, rate: float) -> tuple[list[TraceLoad], float]:
        """The observed windows replayed at `rate`, and the horizon they span in seconds
        (the serving window's at that rate)."""
        if self.own_window:
            return [self.at(rate)], self.count / rate
        runs = horizon_windows(self.load, self.length, self.count, self.windows, rate)
        return runs, self.count / rate

    def described(self) -> str:
        if self.own_window:
            return "serving window (trace too short)"
        runs = horizon_windows(self.load, self.length, self.count, self.windows, 1.0)
        seen = sum(len(r.requests) for r in runs)
        return (f"{len(runs)} windows of the {self.count} requests after {self.length:g} s "
                f"({seen} requests, each replayed at the planned rate over the serving "
                "window's horizon)")  # fmt: skip


def _summary(outs: list[Outcome], slo: Slo) -> LatencySummary:
    return summarize(outs, slo)


class Serving:
    """Every configuration the serving part runs, at one rate each call."""

    def __init__(self, load: TraceLoad, args: argparse.Namespace) -> None:
        self.args = args
        self.win = Windows(load, args)
        self.pool = make_pool(args)
        self.slo = Slo(args.ttft_slo, args.tbt_slo)
        self.choices: dict[tuple[float, str], SplitChoice] = {}

    def split(self, rate: float, k: int, policy: str = "cache_load") -> LatencySummary:
        return _summary(run_split(self.win.at(rate), self.pool, k, policy, self.slo), self.slo)

    def plan(self, rate: float, policy: str = "flexible") -> SplitChoice:
        """The planner's split for `rate` and `policy` (from the observed window), memoised."""
        if (rate, policy) not in self.choices:
            observed, length = self.win.observed_at(rate)
            choice = plan_split(observed, self.pool, self.slo, length, policy)
            self.choices[rate, policy] = choice
        return self.choices[rate, policy]

    def mode(self, name: str, rate: float) -> LatencySummary:
        flag = self.args.prefill_nodes
        if name == "colocated":
            return self.split(rate, 0)
        if name == "disaggregated":
            return self.split(rate, flag)
        if name == "conditional":
            return self.split(rate, flag, "conditional")
        if name == "flexible":
            return self.split(rate, self.plan(rate).prefill_nodes, "flexible")
        raise BadRequestError(f"unknown mode {name!r}")


def serving(load: TraceLoad, args: argparse.Namespace) -> dict:
    """Attainment per mode and per fixed split at every load point; goodput of each; the
    planner's split per load."""
    sv = Serving(load, args)
    rates = sorted(sv.win.base_rate * s for s in args.scale_list)
    points: dict[str, list[SweepPoint]] = {m: [] for m in MODES}
    splits: dict[int, list[SweepPoint]] = {k: [] for k in range(1, args.gpus)}
    for i in range(len(rates) + 2):
        if i >= len(rates):  # everything still passed somewhere: more load (2 doublings)
            if all(points[m][-1].summary.attained < GOODPUT_ATTAINMENT for m in MODES):
                break
            rates.append(rates[-1] * 2)
        rate = rates[i]
        for m in MODES:
            points[m].append(SweepPoint(rate, sv.mode(m, rate)))
        for k in splits:
            got = points["disaggregated"][-1] if k == args.prefill_nodes else None
            splits[k].append(got or SweepPoint(rate, sv.split(rate, k)))
    return _serving_report(sv, points, splits)


def _serving_report(
    sv: Serving, points: dict[str, list[SweepPoint]], splits: dict[int, list[SweepPoint]]
) -> dict:
    args = sv.args
    out: dict = {
        "window_s": args.window_s,
        "requests": len(sv.win.serve.requests),
        # longer than every node's context: rejected (counted as missed) in every mode
        "too_long": len(split_too_long(sv.win.serve, split_specs(sv.pool, 0))[1]),
        "base_rate": sv.win.base_rate,
        "planner_window": sv.win.described(),
        "slo": asdict(sv.slo),
        "modes": {},
        "goodput": {},
        "bisect": {},
    }  # fmt: skip
    for m in MODES:
        extra = refine_goodput(points[m], lambda r, m=m: sv.mode(m, r), args.bisect)
        out["modes"][m] = [{"rate": p.rate, **asdict(p.summary)} for p in points[m]]
        out["bisect"][m] = [{"rate": p.rate, "attained": p.summary.attained} for p in extra]
        out["goodput"][m] = goodput_of([*points[m], *extra])
    out["splits"] = {
        str(k): [{"rate": p.rate, "attained": p.summary.attained} for p in pts]
        for k, pts in splits.items()
    }
    out["split_goodput"] = {str(k): goodput_of(pts) for k, pts in splits.items()}
    out["split_goodput"]["0"] = goodput_of(points["colocated"])
    out["planner"] = [_planner_row(sv, p.rate, splits, points) for p in points["colocated"]]
    return out


def _planner_row(
    sv: Serving, rate: float, splits: dict[int, list[SweepPoint]], points: dict
) -> dict:
    """At one rate: the split the planner chose for each policy (flexible: the conductor's
    per-request role choice; cache_load: the same policy as the fixed splits), what each
    gives on the serving window, and the best fixed split found by exhaustive search."""
    flex, plain = sv.plan(rate), sv.plan(rate, "cache_load")
    fixed = {0: _at(points["colocated"], rate)}
    fixed.update({k: _at(pts, rate) for k, pts in splits.items()})
    best = max(fixed, key=lambda k: (fixed[k], -k))
    return {
        "rate": rate,
        "chosen": flex.prefill_nodes,
        "met": flex.met,
        "reason": flex.reason,
        "tried_on_observed": {str(t): v for t, v in flex.tried.items()},
        "chosen_flexible": _at(points["flexible"], rate),
        "chosen_cache_load_split": plain.prefill_nodes,
        "chosen_cache_load": fixed[plain.prefill_nodes],
        "cache_load_met": plain.met,
        "cache_load_reason": plain.reason,
        "cache_load_tried_on_observed": {str(t): v for t, v in plain.tried.items()},
        "best_fixed": best,
        "best_fixed_attained": fixed[best],
        "fixed": {str(t): v for t, v in fixed.items()},
    }


def _at(pts: Sequence[SweepPoint], rate: float) -> float:
    return next(p.summary.attained for p in pts if p.rate == rate)


# -- cache locality -------------------------------------------------------------------


def locality(load: TraceLoad, args: argparse.Namespace) -> dict:
    """Per policy, cache mode (pooled store / per-node local caches) and load point: TTFT
    attainment and the mean TTFT split into queue, prefix load by source and tier, and
    compute, on the disaggregated split."""
    sv = Serving(load, args)
    rates = sorted(sv.win.base_rate * s for s in args.scale_list)
    rows = []
    for rate in rates:
        for pooled in (True, False):
            pool = make_pool(args, pooled)
            for name in LOCALITY_POLICIES:
                outs = run_split(sv.win.at(rate), pool, args.prefill_nodes, name, sv.slo)
                rows.append(_locality_row(rate, pooled, name, outs, sv.slo))
    return {"split": args.prefill_nodes, "rows": rows}


def _locality_row(rate: float, pooled: bool, policy: str, outs: list[Outcome], slo: Slo) -> dict:
    done = [o for o in outs if o.ttft_s is not None]
    n = max(len(done), 1)
    loads: dict[str, float] = {}
    for o in done:
        for key, secs in o.load_s.items():
            loads[key] = loads.get(key, 0.0) + secs / n
    s = summarize(outs, slo)
    hit = sum(o.cached_blocks for o in outs) / max(sum(o.total_blocks for o in outs), 1)
    return {
        "rate": rate,
        "cache": "pooled" if pooled else "local",
        "policy": policy,
        "ttft_attained": s.ttft_attained,
        "attained": s.attained,
        "ttft_p90": s.ttft_p90,
        "hit": hit,
        "mean_ttft_s": sum(o.ttft_s or 0.0 for o in done) / n,
        "queue_s": sum(o.queue_s for o in done) / n,
        "load_s": dict(sorted(loads.items())),
        "compute_s": sum(o.compute_s for o in done) / n,
    }


# -- online role flips ----------------------------------------------------------------


def online(load: TraceLoad, args: argparse.Namespace) -> dict | None:
    """Mixes that shift mid-run, each served twice in the same run: from the planner's
    split for the first half held fixed, and from that split with the online balancer
    flipping roles (its evaluator: the simulator, `balancer_control`). The first half is
    the trace's window; the second half the shipped Azure conversation trace's short
    prompts, as they are ("lighter") and at `--online-decode-scale` x the rate with
    outputs that many times longer ("decode-heavy")."""
    sv = Serving(load, args)
    half = args.window_s / 2
    first = scale_rate(window(sv.win.serve, 0.0, half), args.online_scale)
    azure = read_trace(data_dir() / "azure_conv_2023.csv")
    x = args.online_decode_scale
    heavy = scale_rate(window(azure, 0.0, half * x), x)
    heavy = TraceLoad(tuple(replace(r, output_len=int(r.output_len * x)) for r in heavy.requests))
    rate = len(first.requests) / half
    flag = args.online_start == "flag"  # every mix from the --prefill-nodes split
    start = args.prefill_nodes if flag else sv.plan(rate).prefill_nodes or max(args.gpus // 2, 1)
    scenarios = [
        ("lighter", window(azure, 0.0, half), "Azure conversation requests"),
        ("decode-heavy", heavy, f"Azure conversation requests at {x:g}x rate, {x:g}x outputs"),
    ]
    out = []
    for name, second, what in scenarios:
        row = _shift(sv, shifted_mix(first, second, half), len(first.requests), start)
        row.update(name=name, first=f"{len(first.requests)} requests of the trace "
                   f"({rate:.2f} req/s)", second=f"{len(second.requests)} {what}")  # fmt: skip
        out.append(row)
    return {"scenarios": out, "sweep": _sweep(sv, load, azure, half)}


def _sweep(sv: Serving, load: TraceLoad, azure: TraceLoad, half: float) -> dict:
    """`--online-mixes` random shifting mixes (seed `--online-seed`) drawn from the trace and
    the Azure conversation trace, each phase's load a random share of the pool (0.4-1.4
    by the demand model) and its outputs stretched 0.5-4x; each from the planner's split
    for its first phase, static vs online flips."""
    args = sv.args
    same = args.trace.resolve() == (data_dir() / "azure_conv_2023.csv").resolve()
    sources = {"trace": load} if same else {"trace": load, "azure": azure}
    mixes = random_mixes(sources, args.online_mixes, half, sv.pool, sv.slo,
                         seed=args.online_seed)  # fmt: skip
    rows = []
    for mix in mixes:
        first = TraceLoad(mix.load.requests[: mix.cut])
        if args.online_start == "flag":
            start = args.prefill_nodes
        else:
            plan = plan_split(first, sv.pool, sv.slo, half, "flexible")
            # colocated gives the balancer nothing to flip: then the best split tried
            start = plan.prefill_nodes or max((k for k in plan.tried if k), key=plan.tried.get)
        row = _shift(sv, mix.load, mix.cut, start)
        row.update(name=mix.name, first=asdict(mix.first), second=asdict(mix.second))
        rows.append(row)
    worst = min(r["online"]["all"] - r["static"]["all"] for r in rows)
    return {"seed": args.online_seed, "start": args.online_start, "mixes": rows,
            "worst_online_minus_static": worst}  # fmt: skip


def _shift(sv: Serving, mix: TraceLoad, cut: int, start: int) -> dict:
    """One shifting mix (`cut` = requests before the shift): static split vs online flips
    (same requests, same run)."""
    balancer = RoleBalancer(
        sv.pool.latency, sv.slo.tbt_s, sv.pool.kv_capacity_tokens,
        BalancerConfig(period_s=sv.args.online_period_s), transfer=sv.pool.transfer,
    )  # fmt: skip
    static = run_split(mix, sv.pool, start, "flexible", sv.slo)
    flips: list[tuple[float, str, str]] = []
    control = balancer_control(balancer, sv.slo, sv.pool, "flexible")

    def record(cluster, seen):  # type: ignore[no-untyped-def]
        before = len(cluster.role_changes)
        control.fn(cluster, seen)
        flips.extend((t, n, r.name) for t, n, r in cluster.role_changes[before:])

    adaptive = run_split(
        mix, sv.pool, start, "flexible", sv.slo, type(control)(record, control.period_s)
    )
    return {
        "start_split": start,
        "static": _halves(static, cut, sv.slo),
        "online": _halves(adaptive, cut, sv.slo),
        "flips": [{"t": t, "node": n, "role": r} for t, n, r in flips],
        "history": balancer.history,
        "verdicts": [asdict(v) for v in balancer.verdicts],
    }


def _halves(outs: list[Outcome], cut: int, slo: Slo) -> dict[str, float]:
    def pick(o: list[Outcome]) -> float:
        return summarize(o, slo).attained

    return {"first": pick(outs[:cut]), "second": pick(outs[cut:]), "all": pick(outs)}
