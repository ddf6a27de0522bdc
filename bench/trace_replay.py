"""Replay a Mooncake (.jsonl) or Azure (.csv) trace through the conductor's real policies.

    python bench/trace_replay.py --trace kvstore/data/mooncake_conversation_trace.jsonl

Part 1, hit ratios (full trace, routing-only fast path): for each policy and total pool
capacity, the prefix hit ratio over a pooled store and over per-node local caches, against
one global LRU of the same total capacity and the infinite-cache bound; load balance is
max/mean of the predicted prefill seconds each node got.
Part 2, serving (full event simulation of a time window of the trace, arrivals scaled to
sweep load): TTFT/TBT attainment and goodput (DistServe: highest rate with >= 90% of requests
meeting both objectives) for colocated, disaggregated (the --prefill-nodes split), conditional
(that split) and flexible serving (per-request role choice on the split the planner picks
from the *next* two windows of the trace), and every fixed split (exhaustive search).
Part 3, the planner: its split per load vs the best fixed split. Part 4, cache locality:
TTFT split into queue, prefix load (local / pooled, by tier) and compute per policy, pooled
and local caches. Part 5, online role flips on a mix that shifts mid-run. Part 6,
heterogeneous hardware (Splitwise's configurations; per cost and per power). Part 7,
DistServe's placement search (OPT-13B, goodput per GPU vs colocated).
Latency model: the conductor's fitted profiles (Splitwise perf model / DistServe data).
Data: Mooncake FAST'25 trace (Apache-2.0), Azure LLM inference trace 2023 (CC-BY 4.0),
machine cost and power (Splitwise; kvstore/data/hardware.csv).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.replay_hardware import hardware, placement
from bench.replay_report import plots, print_tables
from bench.replay_serving import locality, online, serving
from bench.replay_targets import targets
from kvstore.conductor.api import Role
from kvstore.conductor.profiles import PROFILES, fit_reports, load_profile
from kvstore.conductor.registry import POLICIES, make_policy
from kvstore.errors import KVStoreError
from kvstore.sim.cache import TierCapacity, blocks_for_tokens, replay_lru
from kvstore.sim.cluster import uniform_nodes
from kvstore.sim.replay import route_only
from kvstore.sim.traces import TraceLoad, read_trace, window

PARTS = ("hits", "serving", "locality", "online", "hardware", "placement")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", required=True, type=Path)
    p.add_argument("--json", action="store_true", help="print all figures as one JSON object")
    p.add_argument("--quick", action="store_true", help="short run (< 60 s)")
    p.add_argument("--profile", default="llama2-70b/a100-tp4", choices=sorted(PROFILES))
    p.add_argument("--nodes", type=int, default=12, help="nodes in the hit-ratio runs")
    p.add_argument("--capacities", default="3e6,1e7,5e7", help="total pool tokens")
    p.add_argument("--gpus", type=int, default=16, help="nodes in the serving runs")
    p.add_argument("--prefill-nodes", type=int, default=10, help="of --gpus, when disaggregated")
    p.add_argument("--window-s", type=float, default=300.0, help="trace window for serving")
    p.add_argument("--scales", default="0.25,0.5,0.75,1,1.25,1.5", help="arrival-rate factors")
    p.add_argument("--ttft-slo", type=float, default=30.0, help="TTFT objective, seconds")
    p.add_argument("--tbt-slo", type=float, default=0.2, help="TBT (TPOT) objective, seconds")
    p.add_argument("--serve-pool-tokens", type=float, default=1e7, help="pool size in part 2")
    p.add_argument("--bisect", type=int, default=3, help="goodput refinement steps per mode")
    p.add_argument(
        "--planner-windows", type=int, default=2,
        help="windows after the serving window that the planner observes",
    )  # fmt: skip
    p.add_argument("--parts", default=",".join(PARTS), help=f"which parts: {','.join(PARTS)}")
    p.add_argument("--online-scale", type=float, default=1.0, help="rate factor, first half")
    p.add_argument("--online-period-s", type=float, default=30.0, help="balancer period")
    shift_help = "decode-heavy shift: rate and output factor of the second half"
    p.add_argument("--online-decode-scale", type=float, default=4.0, help=shift_help)
    p.add_argument("--online-mixes", type=int, default=6, help="random shifting mixes, online")
    p.add_argument("--online-seed", type=int, default=0, help="seed of the random mixes")
    p.add_argument(
        "--online-start", choices=("planner", "flag"), default="planner",
        help="online mixes start from the planner's split, or from --prefill-nodes",
    )  # fmt: skip
    p.add_argument("--machines", type=int, default=8, help="DGX machines, hardware part")
    p.add_argument(
        "--no-hw-search",
        dest="hw_search",
        action="store_false",
        help="hardware part: only the demand split (no +-1 machine search)",
    )
    p.add_argument("--placement-gpus", type=int, default=8, help="GPU budget, placement part")
    p.add_argument("--placement-window-s", type=float, default=120.0)
    p.add_argument("--placement-ttft-slo", type=float, default=0.25, help="DistServe OPT-13B")
    p.add_argument("--placement-tbt-slo", type=float, default=0.1, help="DistServe OPT-13B")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.capacities, args.window_s, args.scales = "3e6,1e7", 180.0, "0.25,0.5,1"
        args.gpus, args.prefill_nodes = min(args.gpus, 8), min(args.prefill_nodes, 5)
        args.bisect, args.machines, args.placement_window_s = 1, 4, 60.0
        args.placement_gpus = min(args.placement_gpus, 4)
        args.hw_search = False
    if args.nodes <= 0 or args.gpus <= 1 or not 0 < args.prefill_nodes < args.gpus:
        p.error("need --nodes > 0, --gpus > 1 and 0 < --prefill-nodes < --gpus (empty cluster)")
    if args.planner_windows < 1 or args.online_mixes < 1:
        p.error("need --planner-windows >= 1 and --online-mixes >= 1")
    if args.machines < 2 or args.placement_gpus < 2:
        p.error("need --machines >= 2 and --placement-gpus >= 2 (empty cluster)")
    args.part_set = set(args.parts.split(","))
    if not args.part_set <= set(PARTS):
        p.error(f"unknown parts {sorted(args.part_set - set(PARTS))}; valid: {PARTS}")
    slos = (args.ttft_slo, args.tbt_slo, args.placement_ttft_slo, args.placement_tbt_slo)
    if not min(slos) > 0:
        p.error(f"impossible objectives: --ttft-slo {args.ttft_slo} --tbt-slo {args.tbt_slo}")
    args.capacity_list = [int(float(c)) for c in args.capacities.split(",")]
    args.scale_list = [float(s) for s in args.scales.split(",")]
    if min(args.capacity_list) < 512 * args.nodes or min(args.scale_list) <= 0:
        p.error("capacities must give every node at least one block; scales must be > 0")
    return args


def hit_ratios(load: TraceLoad, args: argparse.Namespace, quick_subset: bool) -> list[dict]:
    """Part 1: per capacity, the baselines and each policy over pooled and local caches."""
    prof = load_profile(args.profile)
    inf = replay_lru(load.requests, None)
    rows = []
    for total in args.capacity_list:
        per_node = TierCapacity(blocks_for_tokens(total) // args.nodes)
        specs = uniform_nodes(args.nodes, Role.COLOCATED, per_node, 1 << 40)
        lru = replay_lru(load.requests, per_node.dram_blocks * args.nodes)
        row: dict = {"total_tokens": total, "global_lru": lru.block_ratio}
        row["infinite"] = inf.block_ratio
        row["global_lru_tokens"], row["infinite_tokens"] = lru.token_ratio, inf.token_ratio
        row["policies"] = {}
        names = ("random", "least_loaded", "cache_load") if quick_subset else tuple(POLICIES)
        for name in names:
            row["policies"][name] = {}
            for mode in ("pooled", "local"):
                policy = make_policy(name, latency=prof.latency, transfer=prof.transfer)
                res = route_only(load, specs, policy, prof.latency, pooled=mode == "pooled")
                row["policies"][name][mode] = {
                    "hit": res.hits.block_ratio,
                    "hit_tokens": res.hits.token_ratio,
                    "vs_lru": res.hits.block_ratio / lru.block_ratio if lru.hit_blocks else None,
                    "load_max_mean": res.load_imbalance,
                    "local_share": res.local_share,
                    "rejected": res.rejected,
                }
        rows.append(row)
    return rows


def calibration() -> dict[str, dict | None]:
    """Each latency profile's fit error against the published points it was fitted to."""
    return {name: asdict(r) if r else None for name, r in fit_reports().items()}


def print_calibration(cal: dict[str, dict | None]) -> None:
    print("\n== latency model calibration (relative error vs the published data) ==")
    print(
        f"  {'profile':<22}{'points':>7}{'prefill mean':>14}{'max':>7}{'decode mean':>13}{'max':>7}"
    )
    for name, r in cal.items():
        if r is None:
            print(f"  {name:<22}{'-':>7}  coefficients used as published (no raw points)")
            continue
        print(
            f"  {name:<22}{r['points']:>7}{r['prefill_mean_rel_err']:>14.1%}"
            f"{r['prefill_max_rel_err']:>7.1%}{r['decode_mean_rel_err']:>13.1%}"
            f"{r['decode_max_rel_err']:>7.1%}"
        )


def run_parts(load: TraceLoad, args: argparse.Namespace, report: dict) -> None:
    """Each requested part, in order; a part's bad input becomes its error in the report."""
    todo = args.part_set
    if "hits" in todo:
        hit_load = window(load, 0.0, 900.0) if args.quick else load
        report["hit_ratio_scope"] = "first 15 min (quick)" if args.quick else "full trace"
        report["hit_ratio"] = hit_ratios(hit_load, args, quick_subset=args.quick)
    steps = (
        ("serving", lambda: serving(load, args)),
        ("locality", lambda: locality(load, args)),
        ("online", lambda: online(load, args)),
        ("hardware", lambda: hardware(load, args)),
        ("placement", lambda: placement(args)),
    )
    for name, step in steps:
        if name in todo:
            t = time.perf_counter()
            report[name] = step()
            report.setdefault("part_s", {})[name] = time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    try:
        load = read_trace(args.trace)
    except (OSError, KVStoreError) as exc:  # TraceError is a BadRequestError
        print(f"trace_replay: {exc}", file=sys.stderr)
        return 2
    report: dict = {
        "trace": {
            "path": str(args.trace),
            "requests": len(load.requests),
            "skipped": load.skipped,
            "first_errors": [f"line {n}: {why}" for n, why in load.errors[:5]],
            "minutes": load.duration_s / 60,
        },
        "config": {k: v for k, v in vars(args).items() if k not in ("trace", "part_set")},
    }
    report["config"]["trace"] = str(args.trace)
    report["calibration"] = calibration()
    try:
        run_parts(load, args, report)
    except KVStoreError as exc:
        print(f"trace_replay: {exc}", file=sys.stderr)
        return 2
    report["targets"] = targets(report)
    report["elapsed_s"] = time.perf_counter() - t0
    if not args.no_plots:
        report["plots"] = plots(report)
    if args.json:
        print(json.dumps(report, default=str))
    else:
        print_tables(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
