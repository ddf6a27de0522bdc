"""trace_replay's tables and plots (PNG files under bench/out/)."""

from __future__ import annotations

from pathlib import Path

from bench.replay_serving import MODES

OUT = Path(__file__).resolve().parent / "out"


def print_calibration(cal: dict[str, dict | None]) -> None:
    print("\n== latency model calibration (relative error vs the published data) ==")
    print(
        f"  {'profile':<24}{'points':>7}{'prefill mean':>14}{'max':>7}{'decode mean':>13}{'max':>7}"
    )
    for name, r in cal.items():
        if r is None:
            print(f"  {name:<24}{'-':>7}  coefficients used as published (no raw points)")
            continue
        print(
            f"  {name:<24}{r['points']:>7}{r['prefill_mean_rel_err']:>14.1%}"
            f"{r['prefill_max_rel_err']:>7.1%}{r['decode_mean_rel_err']:>13.1%}"
            f"{r['decode_max_rel_err']:>7.1%}"
        )


def print_hits(report: dict) -> None:
    print(f"\n== prefix hit ratio (blocks), {report['hit_ratio_scope']}, routing-only ==")
    print(
        "  pooled: one store with global LRU eviction (as kvstore's master), so its hit ratio is\n"
        "  the global LRU's whatever the routing; local% = share of hit blocks already on the\n"
        "  prefill node. local: per-node LRU caches of total/nodes each."
    )
    for row in report["hit_ratio"]:
        print(
            f"pool {row['total_tokens'] / 1e6:g}M tokens: global LRU {row['global_lru']:.3%}, "
            f"infinite {row['infinite']:.3%}"
        )
        print(
            f"  {'policy':<14}{'pooled':>9}{'/LRU':>7}{'max/mean':>9}{'local%':>8}"
            f"{'local':>9}{'/LRU':>7}{'max/mean':>9}"
        )
        for name, r in row["policies"].items():
            p, lo = r["pooled"], r["local"]
            print(
                f"  {name:<14}{p['hit']:>9.3%}{p['vs_lru'] or 0:>7.3f}{p['load_max_mean']:>9.3f}"
                f"{p['local_share']:>8.1%}"
                f"{lo['hit']:>9.3%}{lo['vs_lru'] or 0:>7.3f}{lo['load_max_mean']:>9.3f}"
            )


def print_serving(s: dict) -> None:
    print(
        f"\n== serving: first {s['window_s']:g} s of the trace ({s['requests']} requests, "
        f"{s['too_long']} longer than every node's context, rejected; "
        f"{s['base_rate']:.2f} req/s), arrivals scaled; SLO TTFT {s['slo']['ttft_s']} s, "
        f"TBT {s['slo']['tbt_s']} s; planner observes {s['planner_window']} =="
    )
    print(f"  {'rate':>6}" + "".join(f"{m:>15}" for m in MODES) + "   (attainment, TTFT p90 s)")
    for i, pt in enumerate(s["modes"]["colocated"]):
        cells = "".join(
            f"{s['modes'][m][i]['attained']:>8.1%} {s['modes'][m][i]['ttft_p90']:>6.1f}"
            for m in MODES
        )
        print(f"  {pt['rate']:>6.2f}{cells}")
    print("  goodput (req/s): " + ", ".join(f"{m} {s['goodput'][m]:.2f}" for m in MODES))
    ks = sorted(s["split_goodput"], key=int)
    print("  every fixed split (0 = colocated), attainment per rate and goodput:")
    print(f"  {'split':>6}" + "".join(f"{r['rate']:>8.2f}" for r in s["planner"]) + "  goodput")
    for k in ks:
        cells = "".join(f"{row['fixed'][k]:>8.1%}" for row in s["planner"])
        print(f"  {k:>6}{cells}  {s['split_goodput'][k]:.2f}")
    print("\n== planner: split chosen per load (from the observed windows) ==")
    print("  split = prefill nodes (0 = colocated); attainment on the serving window")
    head = f"  {'rate':>6}{'flexible: split':>16}{'met':>5}{'att.':>8}"
    print(head + f"{'cache_load: split':>19}{'met':>5}{'att.':>8}{'best fixed':>12}{'att.':>8}")
    for row in s["planner"]:
        print(
            f"  {row['rate']:>6.2f}{row['chosen']:>16}{'yes' if row['met'] else 'no':>5}"
            f"{row['chosen_flexible']:>8.1%}{row['chosen_cache_load_split']:>19}"
            f"{'yes' if row['cache_load_met'] else 'no':>5}{row['chosen_cache_load']:>8.1%}"
            f"{row['best_fixed']:>12}{row['best_fixed_attained']:>8.1%}"
        )
        if not row["met"]:
            print(f"         flexible: {row['reason']}")
        if not row.get("cache_load_met", True) and "cache_load_reason" in row:
            print(f"         cache_load: {row['cache_load_reason']}")


def print_locality(loc: dict) -> None:
    print(
        f"\n== cache locality: TTFT parts (mean s) on the {loc['split']}-prefill split; "
        "load by source and tier =="
    )
    print(f"  {'rate':>6} {'cache':<7}{'policy':<14}{'TTFT att':>9}{'all att':>8}{'hit':>7}"
          f"{'TTFT':>7}{'queue':>7}{'compute':>8}  load")  # fmt: skip
    for r in loc["rows"]:
        load = ", ".join(f"{k} {v:.3f}" for k, v in r["load_s"].items()) or "-"
        print(
            f"  {r['rate']:>6.2f} {r['cache']:<7}{r['policy']:<14}{r['ttft_attained']:>9.1%}"
            f"{r['attained']:>8.1%}{r['hit']:>7.1%}{r['mean_ttft_s']:>7.2f}{r['queue_s']:>7.2f}"
            f"{r['compute_s']:>8.2f}  {load}"
        )


def print_online(o: dict) -> None:
    for sc in o["scenarios"]:
        print(f"\n== online role flips ({sc['name']}): {sc['first']}, then {sc['second']} ==")
        for name in ("static", "online"):
            h = sc[name]
            print(
                f"  {name:<7} from split {sc['start_split']}: attainment first half "
                f"{h['first']:.1%}, second half {h['second']:.1%}, all {h['all']:.1%}"
            )
        flips = ", ".join(f"{f['node']}->{f['role']} at {f['t']:.0f}s" for f in sc["flips"])
        print(f"  flips: {flips or 'none'}")
    sweep = o.get("sweep")
    if not sweep:
        return
    print(f"\n== online role flips on {len(sweep['mixes'])} random mixes (seed {sweep['seed']}) ==")
    print(f"  {'mix':<7}{'first phase':<30}{'second phase':<30}{'split':>6}{'static':>8}"
          f"{'online':>8}  flips")  # fmt: skip

    def phase(p: dict) -> str:
        return f"{p['source']} load {p['load']:.2f} out x{p['output_factor']:.1f}"

    for m in sweep["mixes"]:
        flips = ", ".join(f"{f['node']}->{f['role']} {f['t']:.0f}s" for f in m["flips"])
        print(f"  {m['name']:<7}{phase(m['first']):<30}{phase(m['second']):<30}"
              f"{m['start_split']:>6}{m['static']['all']:>8.1%}{m['online']['all']:>8.1%}"
              f"  {flips or 'none'}")  # fmt: skip
    print(f"  worst online - static: {sweep['worst_online_minus_static']:+.3f}")


def print_hardware(hw: dict) -> None:
    print(f"\n== heterogeneous hardware: {hw['machines']} machines, {hw['model']} ==")
    print(f"  {'config':<17}{'goodput':>8}{'$/h':>8}{'kW':>7}{'req/s per $/h':>15}"
          f"{'per kW':>8}  nodes")  # fmt: skip
    for r in hw["rows"]:
        print(
            f"  {r['name']:<17}{r['goodput']:>8.2f}{r['cost_per_hour']:>8.1f}{r['power_kw']:>7.1f}"
            f"{r['per_cost']:>15.4f}{r['per_power']:>8.4f}  {r['nodes']}"
        )
    for k, v in hw["ratios"].items():
        cells = ", ".join(f"{m} {x:.2f}x" if x is not None else f"{m} -" for m, x in v.items())
        print(f"  {k}: {cells}")
    p = hw["paper"]
    print(
        f"  paper (Splitwise-HA): {p['throughput_at_0.8_cost']}x throughput at 0.8x cost "
        f"(= {p['per_cost']:.2f}x per cost); {p['same_power_and_cost']}x at equal power and cost"
    )


def print_placement(pl: dict) -> None:
    print(
        f"\n== DistServe placement: {pl['model']}, {pl['gpus']} GPUs, SLO TTFT "
        f"{pl['slo']['ttft_s']} s TBT {pl['slo']['tbt_s']} s; {pl['requests']} requests, "
        f"{pl['too_long']} rejected as longer than the context =="
    )
    ranked = sorted(pl["candidates"].items(), key=lambda kv: -kv[1])
    print("  candidates (goodput req/s): " + ", ".join(f"{k} {v:.2f}" for k, v in ranked))
    print(
        f"  chosen: {pl['placement']}: goodput {pl['goodput']:.2f} req/s "
        f"({pl['goodput_per_gpu']:.3f} per GPU)"
    )
    by_tp = ", ".join(f"TP{t} {g:.2f}" for t, g in pl["colocated_goodput_per_tp"].items())
    print(
        f"  colocated on the same GPUs: {by_tp}; best {pl['colocated_best']} "
        f"({pl['colocated_per_gpu']:.3f} per GPU); placement / colocated "
        f"{pl['ratio_vs_colocated'] or 0:.2f}x"
    )


def print_tables(report: dict) -> None:
    t = report["trace"]
    print(
        f"trace {t['path']}: {t['requests']} requests, {t['skipped']} skipped, "
        f"{t['minutes']:.1f} min"
    )
    print_calibration(report["calibration"])
    sections = (
        ("hit_ratio", lambda: print_hits(report)),
        ("serving", lambda: print_serving(report["serving"])),
        ("locality", lambda: print_locality(report["locality"])),
        ("online", lambda: print_online(report["online"])),
        ("hardware", lambda: print_hardware(report["hardware"])),
        ("placement", lambda: print_placement(report["placement"])),
    )
    for key, show in sections:
        if report.get(key):
            show()
    print("\n== targets ==")
    for k, v in report["targets"].items():
        print(f"  {k}: {v}")
    parts = ", ".join(f"{k} {v:.0f} s" for k, v in report.get("part_s", {}).items())
    print(f"elapsed {report['elapsed_s']:.1f} s ({parts})")


# -- plots ----------------------------------------------------------------------------


def plots(report: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    OUT.mkdir(parents=True, exist_ok=True)
    paths: list[str] = []
    drawers = (
        ("hit_ratio", _hit_plot),
        ("serving", _goodput_plot),
        ("serving", _split_plot),
        ("locality", _locality_plot),
        ("hardware", _hardware_plot),
    )
    for key, draw in drawers:
        if report.get(key):
            paths.append(draw(plt, report))
    plt.close("all")
    return paths


def _save(fig, name: str) -> str:  # type: ignore[no-untyped-def]
    path = str(OUT / name)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def _hit_plot(plt, report: dict) -> str:  # type: ignore[no-untyped-def]
    fig, ax = plt.subplots(figsize=(7, 4))
    rows = report["hit_ratio"]
    caps = [r["total_tokens"] / 1e6 for r in rows]
    ax.plot(caps, [r["global_lru"] for r in rows], "k--", label="global LRU")
    ax.plot(caps, [r["infinite"] for r in rows], "k:", label="infinite")
    for name in rows[0]["policies"]:
        for mode, style in (("pooled", "-o"), ("local", "-x")):
            ax.plot(caps, [r["policies"][name][mode]["hit"] for r in rows], style,
                    label=f"{name} {mode}")  # fmt: skip
    ax.set(xscale="log", xlabel="total pool (M tokens)", ylabel="block hit ratio")
    ax.legend(fontsize=6)
    return _save(fig, "hit_ratio.png")


def _goodput_plot(plt, report: dict) -> str:  # type: ignore[no-untyped-def]
    s = report["serving"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for m in MODES:
        pts = s["modes"][m]
        ax.plot([p["rate"] for p in pts], [p["attained"] for p in pts], "-o",
                label=f"{m} (goodput {s['goodput'][m]:.2f})")  # fmt: skip
    ax.axhline(0.9, color="k", ls=":")
    ax.set(xlabel="request rate (req/s)", ylabel="SLO attainment", title="goodput vs load")
    ax.legend(fontsize=7)
    return _save(fig, "attainment.png")


def _split_plot(plt, report: dict) -> str:  # type: ignore[no-untyped-def]
    rows = report["serving"]["planner"]
    fig, ax = plt.subplots(figsize=(7, 4))
    rates = [r["rate"] for r in rows]
    ax.plot(rates, [r["chosen"] for r in rows], "-o", label="planner's split (flexible)")
    ax.plot(rates, [r["chosen_cache_load_split"] for r in rows], "-s",
            label="planner's split (cache_load)")  # fmt: skip
    ax.plot(rates, [r["best_fixed"] for r in rows], "--x", label="best fixed split (exhaustive)")
    ax.set(xlabel="request rate (req/s)", ylabel="prefill nodes (0 = colocated)",
           title="chosen split per load")  # fmt: skip
    ax.legend()
    return _save(fig, "split.png")


def _locality_plot(plt, report: dict) -> str:  # type: ignore[no-untyped-def]
    rows = report["locality"]["rows"]
    fig, ax = plt.subplots(figsize=(8, 4))
    for cache, style in (("pooled", "-o"), ("local", "--x")):
        for pol in sorted({r["policy"] for r in rows}):
            sel = [r for r in rows if r["cache"] == cache and r["policy"] == pol]
            ax.plot([r["rate"] for r in sel], [r["ttft_attained"] for r in sel], style,
                    label=f"{pol} {cache}")  # fmt: skip
    ax.set(xlabel="request rate (req/s)", ylabel="TTFT attainment", title="cache locality")
    ax.legend(fontsize=7)
    return _save(fig, "locality.png")


def _hardware_plot(plt, report: dict) -> str:  # type: ignore[no-untyped-def]
    rows = report["hardware"]["rows"]
    names = [r["name"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in (
        (axes[0], "per_cost", "req/s per $/h"),
        (axes[1], "per_power", "req/s per kW"),
    ):
        ax.bar(names, [r[key] for r in rows])
        ax.set(ylabel=label)
        ax.tick_params(axis="x", rotation=45, labelsize=7)
    fig.suptitle("throughput at the objectives per cost and per power")
    fig.subplots_adjust(wspace=0.35)
    return _save(fig, "hardware.png")
