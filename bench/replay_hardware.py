"""trace_replay's hardware parts: Splitwise's heterogeneous configurations (throughput at the
objectives per cost and per power) and DistServe's placement search (goodput per GPU
against colocated serving on the same GPUs)."""

from __future__ import annotations

import argparse

from kvstore.conductor.hardware import node_kind
from kvstore.conductor.profiles import data_dir
from kvstore.errors import BadRequestError
from kvstore.sim.cache import TierCapacity, blocks_for_tokens
from kvstore.sim.metrics import LatencySummary, summarize
from kvstore.sim.placement import (
    Fleet,
    goodput_search,
    observed_load,
    run_fleet,
    search_placement,
    splitwise_fleets,
)
from kvstore.sim.replay import Slo, split_too_long
from kvstore.sim.traces import TraceLoad, read_trace, scale_rate, window

# Splitwise (ISCA'24) abstract: "1.4x higher throughput at 20% lower cost than current
# designs", or "2.35x more throughput under the same power and cost budgets"
PAPER = {"throughput_at_0.8_cost": 1.4, "per_cost": 1.4 / 0.8, "same_power_and_cost": 2.35}


def fleet_goodput(
    win: TraceLoad, fleet: Fleet, slo: Slo, cache: TierCapacity, bisect: int
) -> tuple[float, int]:
    """(goodput of `fleet` on `win` scaled, simulations run)."""
    base = len(win.requests) / max(win.requests[-1].arrival_s, 1e-9)

    def run(rate: float) -> LatencySummary:
        return summarize(run_fleet(scale_rate(win, rate / base), fleet, slo, cache), slo)

    res = goodput_search(run, base, bisect=bisect)
    return res.goodput, len(res.points)


def hardware(load: TraceLoad, args: argparse.Namespace) -> dict:
    """Splitwise's configurations on `--machines` DGX machines (Llama2-70B, TP8 each)."""
    win = window(load, 0.0, args.window_s)
    slo = Slo(args.ttft_slo, args.tbt_slo)
    kinds = {h: node_kind("llama2-70b", h, 8) for h in ("a100", "h100", "h100pcap")}
    cache = TierCapacity(blocks_for_tokens(int(args.serve_pool_tokens)) // args.machines)
    fleets = splitwise_fleets(kinds, args.machines, observed_load(win, slo), slo.tbt_s)
    rows = []
    for fleet in fleets:
        best = _best_split(win, fleet, slo, cache, args)
        g, runs = best
        rows.append(_fleet_row(g[0], g[1], runs))
    by = {r["name"]: r for r in rows}
    return {
        "machines": args.machines,
        "model": "llama2-70b TP8 per machine",
        "rows": rows,
        "ratios": _ratios(by),
        "paper": PAPER,
    }


def _best_split(
    win: TraceLoad, fleet: Fleet, slo: Slo, cache: TierCapacity, args: argparse.Namespace
) -> tuple[tuple[Fleet, float], int]:
    """The fleet's goodput at its demand split and, for split fleets, one machine either
    way (the better one wins); the simulations it took."""
    options = [fleet]
    if fleet.decode and args.hw_search:
        p, d, n = fleet.prefill[0], fleet.decode[0], len(fleet.kinds)
        k = len(fleet.prefill)
        options += [
            Fleet(fleet.name, (p,) * j, (d,) * (n - j)) for j in (k - 1, k + 1) if 0 < j < n
        ]
    runs, best = 0, (fleet, -1.0)
    for f in options:
        g, r = fleet_goodput(win, f, slo, cache, args.bisect)
        runs += r
        if g > best[1]:
            best = (f, g)
    return best, runs


def _fleet_row(fleet: Fleet, goodput: float, runs: int) -> dict:
    return {
        "name": fleet.name,
        "nodes": fleet.describe(),
        "goodput": goodput,
        "cost_per_hour": fleet.cost_per_hour,
        "power_kw": fleet.power_kw,
        "per_cost": goodput / fleet.cost_per_hour,  # req/s per $/h
        "per_power": goodput / fleet.power_kw,  # req/s per kW
        "runs": runs,
    }


def _ratios(by: dict[str, dict]) -> dict[str, dict[str, float | None]]:
    """Each Splitwise configuration's throughput, per cost and per power vs the baselines."""
    out: dict[str, dict[str, float | None]] = {}
    for name, row in by.items():
        if not name.startswith("Splitwise"):
            continue
        for base in ("Baseline-H100", "Baseline-A100"):
            b = by[base]
            out[f"{name} vs {base}"] = {
                k: (row[k] / b[k] if b[k] else None) for k in ("goodput", "per_cost", "per_power")
            }
    return out


def placement(args: argparse.Namespace) -> dict:
    """DistServe's placement for OPT-13B on A100s (TP 1, 2, 4) on its chatbot objectives,
    on the shipped Azure conversation trace (OPT's 2048-token context: longer requests are
    rejected and counted)."""
    load = read_trace(data_dir() / "azure_conv_2023.csv")
    win = window(load, 0.0, args.placement_window_s)
    slo = Slo(args.placement_ttft_slo, args.placement_tbt_slo)
    kinds = [node_kind("opt-13b", "a100", tp) for tp in (1, 2, 4)]
    cache = TierCapacity(1)  # no prefix reuse in the Azure trace
    fits, long = split_too_long(win, Fleet("probe", (kinds[0],)).specs(cache))
    if not fits:
        raise BadRequestError(f"all {len(long)} requests exceed OPT's context")
    win = TraceLoad(tuple(fits))
    gpus = args.placement_gpus

    def goodput(fleet: Fleet) -> float:
        return fleet_goodput(win, fleet, slo, cache, args.bisect)[0]

    found = search_placement(kinds, gpus, goodput)
    fits_budget = [k for k in kinds if k.gpus <= gpus]
    coloc = {k.gpus: goodput(Fleet(f"TP{k.gpus}", (k,) * (gpus // k.gpus))) for k in fits_budget}
    best_tp = max(coloc, key=lambda t: coloc[t])
    return {
        "model": "opt-13b on A100-80GB",
        "slo": {"ttft_s": slo.ttft_s, "tbt_s": slo.tbt_s},
        "gpus": gpus,
        "too_long": len(long),
        "requests": len(fits),
        "candidates": found.tried,
        "placement": found.best.describe(),
        "goodput": found.goodput,
        "goodput_per_gpu": found.per_gpu,
        "colocated_goodput_per_tp": coloc,
        "colocated_best": f"{gpus // best_tp}x TP{best_tp}",
        "colocated_goodput": coloc[best_tp],
        "colocated_per_gpu": coloc[best_tp] / gpus,
        "ratio_vs_colocated": found.goodput / coloc[best_tp] if coloc[best_tp] else None,
    }
