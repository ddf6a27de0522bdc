"""Prefill/decode interference: colocated vs disaggregated serving on 2 cores.

A steady stream of decode-heavy requests, plus bursts of long prompts, against
    colocated       two colocated nodes, one core each, requests round-robin
    disaggregated   a prefill node on core 0 and a decode node on core 1 (the
                    master and a storage node share the cores; they mostly idle: the
                    storage node runs without NIXL, whose idle progress thread spins)
at the same total compute. Reports TTFT and TBT (time between tokens) p50/p99 of
the stream alone (the no-burst baseline), of the stream under bursts, and of short
prompts at light load; and the KV handoff time (publish + pull) as a fraction of
the prefill compute for long prompts. Ratios are against baselines of this run.

    python bench/interference.py [--quick] [--json] [--model small|tiny]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvstore.serving_bench.launch import Launcher
from kvstore.serving_bench.report import interference_report, render_table
from kvstore.serving_bench.scenario import BenchSizes, run_bench
from kvstore.serving_bench.workload import MixSpec


def sizes_for(model: str, quick: bool) -> BenchSizes:
    """Schedules at nominal speed of the small model on one core: a decode step of
    ~30 ms at batch 2-3, a 256-token prefill of ~0.5 s. A stall shows at TBT p99
    only when >= 1% of the stream's gaps are stalled, and the one prefill core of
    the disaggregated mode must keep up (bursts use ~1/3 of it at nominal speed,
    about 3/4 measured with the decode core busy): so long prompts of ~10-20 decode
    steps, every ~3 s, i.e. one stall per ~50-100 steps per colocated node."""
    heavy = MixSpec(
        duration_s=6.0 if quick else 18.0,
        stream_every_s=0.4,
        stream_prompt=16,
        stream_tokens=32,
        burst_every_s=3.0,
        burst_size=2,
        burst_prompt=256,
        burst_tokens=4,
        first_burst_s=1.0,
    )
    light = MixSpec(
        duration_s=4.8 if quick else 9.6,
        stream_every_s=0.6,
        stream_prompt=64,
        stream_tokens=16,
        poisson=True,
        seed=1,
    )
    return BenchSizes(
        model=model,
        heavy=heavy,
        light=light,
        long_prompt=2048,
        long_count=0 if quick else 1,
        light_parts=4,
        reference_prefill_s=0.5 if model == "small" else 0.05,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short phases, no 2k-token probe")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--model", default="small", choices=["small", "tiny"])
    parser.add_argument("--slowdown", type=float, default=None,
                        help="stretch arrival intervals by this (default: measured)")  # fmt: skip
    parser.add_argument("--log-dir", default=None, help="keep the nodes' stderr here")
    parser.add_argument("--out", default="bench/out/interference",
                        help="writes OUT.json and OUT.png ('' = neither)")  # fmt: skip
    args = parser.parse_args(argv)
    sizes = sizes_for(args.model, args.quick)
    started = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {msg}", file=sys.stderr, flush=True)

    with (
        tempfile.TemporaryDirectory(prefix="kvstore-interference-") as tmp,
        Launcher(log_dir=args.log_dir or tmp) as procs,
    ):
        run = run_bench(sizes, procs, args.slowdown, 2 if args.quick else 4, progress)
        trouble = procs.close()
    report = interference_report(run)
    report["config"] = {
        "model": args.model,
        "quick": args.quick,
        "burst_prompt_tokens": sizes.heavy.burst_prompt,
        "stream_prompt_tokens": sizes.heavy.stream_prompt,
        "stream_max_tokens": sizes.heavy.stream_tokens,
        "light_prompt_tokens": sizes.light.stream_prompt,
        "seconds": round(time.perf_counter() - started, 1),
        "process_trouble": trouble,
    }
    if args.out:
        from bench.plots import plot_interference, write_outputs

        png = write_outputs(report, args.out, plot_interference)
        progress(f"wrote {args.out}.json and {png}")
    if args.json:
        print(json.dumps(report, allow_nan=False))
    else:
        print(render_table(report))
        print(f"slow-down vs nominal: {report['slowdown']}; {report['config']['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
