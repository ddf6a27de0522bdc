"""PNG figures of the benches that sweep, written next to their JSON (matplotlib, Agg).

write_outputs(doc, "bench/out/interference", plot_interference)   # .json and .png
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_outputs(
    doc: dict[str, Any], stem: str, plot: Callable[[dict[str, Any], str], None]
) -> str:
    """Write `stem`.json and `stem`.png; the PNG path."""
    Path(stem).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{stem}.json").write_text(json.dumps(doc, indent=1, allow_nan=False))
    plot(doc, f"{stem}.png")
    return f"{stem}.png"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _get(d: dict[str, Any], *path: str) -> float:
    for key in path:
        d = d.get(key, {}) if isinstance(d, dict) else {}
    return float(d) if isinstance(d, int | float) else float("nan")


def plot_interference(report: dict[str, Any], path: str) -> None:
    """TBT p50/p99 without and with bursts of long prompts, per mode; light-load TTFT."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    modes = ("colocated", "disaggregated")
    phases = (("stream", "no bursts"), ("burst", "bursts"))
    width = 0.2
    for i, (phase, label) in enumerate(phases):
        for j, pct in enumerate(("p50", "p99")):
            xs = [m + (2 * i + j - 1.5) * width for m in range(len(modes))]
            ys = [_get(report, mode, phase, "tbt_ms", pct) for mode in modes]
            ax1.bar(xs, ys, width, label=f"{label} {pct}")
    ax1.set_xticks(range(len(modes)), modes)
    ax1.set_ylabel("TBT (ms)")
    ax1.set_title("decode TBT, steady streams vs bursts of long prompts")
    ax1.legend(fontsize=8)
    for j, pct in enumerate(("p50", "p99")):
        ys = [_get(report, mode, "light", "ttft_ms", pct) for mode in modes]
        ax2.bar([m + (j - 0.5) * 0.35 for m in range(len(modes))], ys, 0.35, label=pct)
    ax2.set_xticks(range(len(modes)), modes)
    ax2.set_ylabel("TTFT (ms)")
    ax2.set_title("light load, short prompts: TTFT")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_transfer(doc: dict[str, Any], path: str) -> None:
    """GB/s per transport and object size, get and put, against each row's baseline."""
    plt = _pyplot()
    rows = [r for r in doc["rows"] if r["baseline"]]  # baseline rows are drawn dashed
    ops = sorted({r["op"] for r in rows})
    fig, axes = plt.subplots(1, len(ops), figsize=(6 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops, strict=True):
        mine = [r for r in rows if r["op"] == op]
        for transport in sorted({r["transport"] for r in mine}):
            pts = sorted((r["size"], r["gbps"]) for r in mine if r["transport"] == transport)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=transport)
        for baseline in sorted({r["baseline"] for r in mine}):  # the same-run denominators
            pts = sorted(
                {(r["size"], r["baseline_gbps"]) for r in mine if r["baseline"] == baseline}
            )
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls="--", marker=".",
                    label=f"baseline: {baseline}")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("object size (bytes)")
        ax.set_ylabel("GB/s")
        ax.set_title(f"pool {op}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
