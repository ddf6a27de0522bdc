"""The issue's targets, evaluated on what one trace_replay run measured."""

from __future__ import annotations

ROLE_SLACK = 0.01  # role choice: attainment >= best of the others - 0.01
PLANNER_SHARE = 0.95  # planner: within 5% of the best fixed split


def targets(report: dict) -> dict:
    res: dict = {}
    if "hit_ratio" in report:
        res.update(_hits(report["hit_ratio"]))
    s = report.get("serving")
    if s:
        res.update(_roles(s))
        res.update(_planner(s))
    on = report.get("online")
    if on:
        mixes = [*on["scenarios"], *on.get("sweep", {}).get("mixes", [])]
        res["online_ge_fixed_minus_0.01_on_every_mix"] = [
            m["online"]["all"] >= m["static"]["all"] - ROLE_SLACK for m in mixes
        ]
    hw = report.get("hardware")
    if hw:
        res["splitwise_ha_vs_h100"] = hw["ratios"].get("Splitwise-HA vs Baseline-H100")
        res["splitwise_ha_vs_a100"] = hw["ratios"].get("Splitwise-HA vs Baseline-A100")
        res["paper"] = hw["paper"]
    pl = report.get("placement")
    if pl:
        res["distserve_placement_vs_colocated"] = pl["ratio_vs_colocated"]
    return res


def _hits(rows: list[dict]) -> dict:
    within, vs_random = [], []
    for row in rows:
        cl = row["policies"]["cache_load"]["pooled"]
        within.append(
            None  # no prefix reuse in the trace (Azure): nothing to compare
            if row["global_lru"] == 0
            else cl["hit"] >= 0.95 * row["global_lru"] and cl["load_max_mean"] <= 1.25
        )
        rnd = row["policies"]["random"]["local"]["hit"]
        vs_random.append(cl["hit"] / rnd if rnd else None)
    return {"hit_within_5pct_of_lru_and_balanced": within, "hit_vs_random_local": vs_random}


def _roles(s: dict) -> dict:
    """Flexible (per-request role choice on the planner's split) against colocated,
    disaggregated and the best fixed split, at every load point and in goodput."""
    m = s["modes"]
    ok, margin = [], []
    for i, pt in enumerate(m["flexible"]):
        others = [m["colocated"][i]["attained"], m["disaggregated"][i]["attained"]]
        others += [pts[i]["attained"] for pts in s["splits"].values()]
        margin.append(pt["attained"] - max(others))
        ok.append(pt["attained"] >= max(others) - ROLE_SLACK)
    best = max([s["goodput"]["colocated"], s["goodput"]["disaggregated"],
                *s["split_goodput"].values()])  # fmt: skip
    cond = [
        c["attained"] >= max(a["attained"], d["attained"]) - 1e-12
        for a, d, c in zip(m["colocated"], m["disaggregated"], m["conditional"], strict=True)
    ]
    return {
        "flexible_ge_best_minus_0.01_at_every_load": ok,
        "flexible_margin_vs_best": margin,
        "flexible_goodput_vs_best": s["goodput"]["flexible"] / best if best else None,
        "conditional_ge_best_at_every_load": cond,
    }


def _planner(s: dict) -> dict:
    """At each load, the attainment (= goodput at that load: rate x attainment, same rate)
    of the planner's split against the best fixed split's."""
    same, flex = [], []
    for row in s["planner"]:
        best = row["best_fixed_attained"]
        same.append(row["chosen_cache_load"] / best if best else None)
        flex.append(row["chosen_flexible"] / best if best else None)
    best_gp = max(s["split_goodput"].values())
    return {
        # DistServe's goodput (highest swept rate with >= 90% attainment there and below) of
        # the planner's split per load, against the best fixed split's (swept rates only)
        "planner_goodput_vs_best_fixed (cache_load)": _gp(s["planner"], "chosen_cache_load")
        / best_gp
        if best_gp
        else None,
        "planner_goodput_vs_best_fixed (flexible)": _gp(s["planner"], "chosen_flexible") / best_gp
        if best_gp
        else None,
        "planner_vs_best_fixed (cache_load planned and run)": same,
        "planner_vs_best_fixed (flexible planned and run)": flex,
        "planner_within_5pct_at_every_load (cache_load)": [
            r is None or r >= PLANNER_SHARE for r in same
        ],
        "planner_within_5pct_at_every_load (flexible)": [
            r is None or r >= PLANNER_SHARE for r in flex
        ],
    }


def _gp(rows: list[dict], key: str) -> float:
    best = 0.0
    for row in sorted(rows, key=lambda r: r["rate"]):
        if row[key] < 0.9:
            break
        best = row["rate"]
    return best
