"""Turn the interference runs into figures, ratios and target verdicts.

Figures per serving mode (milliseconds):
    stream   the decode stream alone: its TBT p99 is the no-burst TBT
    burst    the same stream with bursts of long prompts (figures of the stream's
             requests: the victims), plus the long prompts' prefill time
    light    short prompts at light load
    long     (disaggregated) very long prompts alone: KV handoff vs prefill compute

Ratios: burst TBT p99 over the mode's own no-burst TBT p99, and over the pure
decode baseline (the disaggregated decode node serving the stream alone).
"""

from __future__ import annotations

from typing import Any

from kvstore.serving_bench.metrics import Dist, RequestRecord, summarize
from kvstore.serving_bench.scenario import BenchRun, ModeRun

TARGETS = {
    "disagg_tbt_ratio_max": 1.5,
    "colocated_tbt_ratio_min": 3.0,
    "kv_fraction_max": 0.10,
}


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return round(a / b, 3)


def mode_figures(run: ModeRun) -> dict[str, Any]:
    recs = run.records
    out: dict[str, Any] = {
        "foreign_cpu_cores": {
            phase: round(sum(v) / len(v), 2) for phase, v in run.foreign_cores.items() if v
        }
    }
    for phase, kinds in (("stream", ("stream",)), ("burst", ("stream",)), ("light", ("stream",))):
        if phase in recs:
            out[phase] = summarize(recs[phase], kinds).as_dict()
    if "burst" in recs:
        bursts = [r for r in recs["burst"] if r.kind == "burst" and r.ok]
        out["burst_prompts"] = summarize(recs["burst"], ("burst",)).as_dict()
        out["burst_prefill_ms"] = Dist.of([r.compute_s for r in bursts]).as_dict()
    if "long" in recs:
        out["long"] = _long(recs["long"])
    return out


def _long(records: list[RequestRecord]) -> dict[str, Any]:
    s = summarize(records, ("long",))
    ok = [r for r in records if r.ok]
    return {
        **s.as_dict(),
        "prompt_tokens": max((r.prompt_tokens for r in records), default=0),
        "prefill_compute_ms": Dist.of([r.compute_s for r in ok]).as_dict(),
        "publish_ms": Dist.of([r.publish_s for r in ok]).as_dict(),
        "publish_wait_ms": Dist.of([r.publish_wait_s for r in ok]).as_dict(),
        "pull_ms": Dist.of([r.pull_s for r in ok]).as_dict(),
    }


def _p(fig: dict[str, Any], phase: str, metric: str, q: str = "p99") -> float | None:
    return fig.get(phase, {}).get(metric, {}).get(q)


def interference_report(run: BenchRun) -> dict[str, Any]:
    """Every figure, ratio and verdict, JSON-ready."""
    co, dis = mode_figures(run.runs["colocated"]), mode_figures(run.runs["disaggregated"])
    pure = _p(dis, "stream", "tbt_ms")
    co_burst = _p(co, "burst", "tbt_ms")
    ratios = {
        "colocated_tbt_burst_over_no_burst": _ratio(co_burst, _p(co, "stream", "tbt_ms")),
        "disagg_tbt_burst_over_no_burst": _ratio(_p(dis, "burst", "tbt_ms"), pure),
        "colocated_tbt_burst_over_pure_decode": _ratio(co_burst, pure),
        "colocated_tbt_p99_over_burst_prefill_p50": _ratio(
            _p(co, "burst", "tbt_ms"), co.get("burst_prefill_ms", {}).get("p50")
        ),
        "light_ttft_p50_disagg_over_colocated": _ratio(
            _p(dis, "light", "ttft_ms", "p50"), _p(co, "light", "ttft_ms", "p50")
        ),
        "light_ttft_p99_disagg_over_colocated": _ratio(
            _p(dis, "light", "ttft_ms"), _p(co, "light", "ttft_ms")
        ),
    }  # fmt: skip
    kv = dis.get("long") or dis.get("burst_prompts", {})
    kv_p50 = kv.get("kv_fraction", {}).get("p50")
    targets = {
        "disagg_tbt_within_1.5x": _verdict(ratios["disagg_tbt_burst_over_no_burst"], "<=", 1.5),
        "colocated_tbt_at_least_3x": _verdict(
            ratios["colocated_tbt_burst_over_no_burst"], ">=", 3.0
        ),
        "kv_transfer_under_10pct": _verdict(kv_p50, "<=", TARGETS["kv_fraction_max"]),
        "colocated_wins_light_ttft": _verdict(
            ratios["light_ttft_p50_disagg_over_colocated"], ">", 1.0
        ),
    }
    return {
        "colocated": co,
        "disaggregated": dis,
        "ratios": ratios,
        "targets": targets,
        "slowdown": {
            "applied": round(run.slowdown, 3),
            "measured": {m: round(v, 3) for m, v in run.measured_slowdown.items()},
        },
        "processes": {"idle_cpu_cores": run.idle_cores, "cpus_allowed": run.cpus_allowed},
    }


def _verdict(value: float | None, op: str, bound: float) -> dict[str, Any]:
    if value is None:
        return {"value": None, "met": False, "rule": f"{op} {bound}"}
    met = {"<=": value <= bound, ">=": value >= bound, ">": value > bound}[op]
    return {"value": value, "met": met, "rule": f"{op} {bound}"}


COLUMNS = (("ttft_ms", "p50"), ("ttft_ms", "p99"), ("tbt_ms", "p50"), ("tbt_ms", "p99"))


def _cell(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:,.1f}{unit}"


def render_table(report: dict[str, Any]) -> str:
    """Per mode and phase: TTFT and TBT p50/p99 (ms); then ratios and verdicts."""
    head = (
        f"{'mode':<14}{'phase':<8}{'TTFT p50':>10}{'TTFT p99':>10}{'TBT p50':>9}{'TBT p99':>9}"
        f"{'other load':>11}"
    )
    lines = [head, "-" * len(head)]
    for mode in ("colocated", "disaggregated"):
        fig = report[mode]
        for phase in ("stream", "burst", "light"):
            if phase not in fig:
                continue
            cells = [_cell(_p(fig, phase, m, q)) for m, q in COLUMNS]
            other = fig["foreign_cpu_cores"].get(phase)
            cells.append("-" if other is None else f"{other:.2f} cpu")
            lines.append(
                f"{mode:<14}{phase:<8}{cells[0]:>10}{cells[1]:>10}{cells[2]:>9}{cells[3]:>9}"
                f"{cells[4]:>11}"
            )
        pre = fig.get("burst_prefill_ms", {}).get("p50")
        lines.append(f"{'':<14}long-prompt prefill p50 {_cell(pre, ' ms')}")
    handoff = _p(report["disaggregated"], "light", "handoff_ms", "p50")
    lines.append(
        f"light load, disaggregated: prefill response -> first streamed token (decode RPC + "
        f"KV pull) p50 {_cell(handoff, ' ms')}"
    )
    lines.append("light load, on the node that prefills: " + "; ".join(
        f"{mode} queue p50/p99 {_cell(_p(report[mode], 'light', 'node_queue_ms', 'p50'))}/"
        f"{_cell(_p(report[mode], 'light', 'node_queue_ms'))} ms, compute p50/p99 "
        f"{_cell(_p(report[mode], 'light', 'prefill_compute_ms', 'p50'))}/"
        f"{_cell(_p(report[mode], 'light', 'prefill_compute_ms'))} ms"
        for mode in ("colocated", "disaggregated")
    ))  # fmt: skip
    idle = report.get("processes", {}).get("idle_cpu_cores", {})
    if idle:
        lines.append(
            "idle CPU per process (cores): " + ", ".join(f"{k} {v}" for k, v in idle.items())
        )
    long = report["disaggregated"].get("long")
    if long:
        frac = long["kv_fraction"]["p50"]
        lines.append(
            f"KV handoff, {long['prompt_tokens']}-token prompts: (publish + pull) / prefill = "
            f"{_cell(None if frac is None else frac * 100, '%')}, exposed "
            f"{_cell(_pct(long['kv_exposed_fraction']['p50']), '%')}"
        )
    lines.append("ratios: " + ", ".join(f"{k}={v}" for k, v in report["ratios"].items()))
    for name, v in report["targets"].items():
        lines.append(
            f"target {name}: {v['value']} {v['rule']} -> {'met' if v['met'] else 'NOT met'}"
        )
    return "\n".join(lines)


def _pct(x: float | None) -> float | None:
    return None if x is None else x * 100
