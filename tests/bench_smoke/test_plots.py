"""bench/plots.py: the interference and transfer figures are real PNGs next to their JSON."""

from __future__ import annotations

import json
from pathlib import Path

from bench.plots import plot_interference, plot_transfer, write_outputs

PNG = b"\x89PNG\r\n\x1a\n"


def _mode(tbt: float) -> dict[str, object]:
    return {
        phase: {"tbt_ms": {"p50": tbt, "p99": 2 * tbt}, "ttft_ms": {"p50": 5.0, "p99": 9.0}}
        for phase in ("stream", "burst", "light")
    }


def test_interference_png_and_json(tmp_path: Path) -> None:
    report = {"colocated": _mode(20.0), "disaggregated": _mode(10.0)}
    png = write_outputs(report, str(tmp_path / "out" / "interference"), plot_interference)
    assert Path(png).read_bytes()[:8] == PNG and Path(png).stat().st_size > 10_000
    assert json.loads((tmp_path / "out" / "interference.json").read_text()) == report


def test_transfer_png_skips_baseline_rows(tmp_path: Path) -> None:
    rows = [
        {"size": s, "transport": t, "op": op, "gbps": g, "baseline": b, "baseline_gbps": bg}
        for s in (1 << 16, 1 << 20)
        for t, op, g, b, bg in (
            ("shm", "get", 5.0, "memcpy", 8.0), ("tcp", "put", 2.0, "raw socket", 2.5),
            ("memcpy", "copy", 8.0, "", 0.0),
        )
    ]  # fmt: skip
    png = write_outputs({"rows": rows}, str(tmp_path / "transfer"), plot_transfer)
    assert Path(png).read_bytes()[:8] == PNG
