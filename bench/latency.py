"""Single-object put and get latency, kvstore vs Mooncake Store, in one run (issue 14).

For each store, a pool in other processes (a master, and a process lending the
segment: `kvstore node` / a Mooncake client holding one), then this process as a
client of it through the same API: Mooncake's `MooncakeDistributedStore` (its wheel)
and kvstore's facade of it (`kvstore.compat.mooncake`), zero-copy `put_from` /
`get_into` from a registered buffer, one object per call, fresh keys. Every call is
timed; p50 and p99 per size and op. Mooncake processes bind 127.0.0.1
(MC_TCP_BIND_ADDRESS). Ratios are kvstore / Mooncake p50 (target <= 0.7 at 64 KiB and
1 MiB).

    python bench/latency.py [--ops 200] [--sizes-kib 4,64,1024,16384] [--repeat 3]
                            [--json] [--save bench/results/latency.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")

from mooncake_side_by_side import kvstore_pool, mooncake_pool, stores  # noqa: E402

MiB = 1 << 20


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] * 1e6


def measure(module: str, master: str, size: int, ops: int, env: dict[str, str]) -> dict[str, Any]:
    """p50/p99 microseconds of `ops` single-object puts then gets of `size` bytes."""
    os.environ.update(env)
    mod = importlib.import_module(module)
    store = mod.MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 0, size + MiB, "tcp", "", master)
    if rc != 0:
        raise RuntimeError(f"{module} setup failed: {rc}")
    try:
        src = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
        dst = np.empty(size, dtype=np.uint8)
        for arr in (src, dst):
            if store.register_buffer(arr.ctypes.data, arr.nbytes) != 0:
                raise RuntimeError(f"{module}: register_buffer failed")
        prefix = f"lat{uuid.uuid4().hex[:8]}"
        puts, gets = [], []
        for i in range(ops + 5):  # the first 5 warm connections and mappings up
            t0 = time.perf_counter()
            rc = store.put_from(f"{prefix}-{i}", src.ctypes.data, size)
            t1 = time.perf_counter()
            if rc != 0:
                raise RuntimeError(f"{module}: put_from returned {rc}")
            if i >= 5:
                puts.append(t1 - t0)
        for i in range(ops + 5):
            t0 = time.perf_counter()
            n = store.get_into(f"{prefix}-{i}", dst.ctypes.data, size)
            t1 = time.perf_counter()
            if n != size:
                raise RuntimeError(f"{module}: get_into returned {n}")
            if i >= 5:
                gets.append(t1 - t0)
        if not np.array_equal(src, dst):
            raise RuntimeError(f"{module}: wrong bytes read back")
        return {
            "put_p50_us": _pct(puts, 0.5), "put_p99_us": _pct(puts, 0.99),
            "get_p50_us": _pct(gets, 0.5), "get_p99_us": _pct(gets, 0.99),
            "put_mean_us": statistics.fmean(puts) * 1e6,
            "get_mean_us": statistics.fmean(gets) * 1e6,
        }  # fmt: skip
    finally:
        store.close()


def one_run(sizes: list[int], ops: int, tmp: Path) -> list[dict[str, Any]]:
    """Every store at every size, sizes interleaved (Mooncake then kvstore per size, so
    a slow spell of the host falls on both), with ratios to Mooncake's p50."""
    rows = []
    for size in sizes:
        base: dict[str, Any] = {}
        for label, module, extra, _ in stores():
            if label == "kvstore-tcp":
                continue  # the default transport only (shm on one host)
            pool = mooncake_pool if label == "mooncake" else kvstore_pool
            segment = size * (ops + 5) * 5 // 4 + 64 * MiB
            with pool(segment, True, tmp / f"{label}.log") as master:
                row = {"store": label, "size": size, **measure(module, master, size, ops, extra)}
            if label == "mooncake":
                base = row
            elif base:
                row["put_p50_x_mc"] = row["put_p50_us"] / base["put_p50_us"]
                row["get_p50_x_mc"] = row["get_p50_us"] / base["get_p50_us"]
            rows.append(row)
    return rows


def _median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row: numbers are medians over the runs."""
    out = dict(rows[0])
    for k, v in rows[0].items():
        if isinstance(v, float | int) and k != "size":
            out[k] = statistics.median(r[k] for r in rows)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=200)
    p.add_argument("--sizes-kib", default="4,64,1024,16384")
    p.add_argument("--repeat", type=int, default=1, help="runs; the table shows medians")
    p.add_argument("--json", action="store_true")
    p.add_argument("--save", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    sizes = [int(s) << 10 for s in args.sizes_kib.split(",")]
    runs: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="kvs-lat-") as tmp:
        for _ in range(args.repeat):
            runs.append(one_run(sizes, args.ops, Path(tmp)))
    rows = [_median_row([run[i] for run in runs]) for i in range(len(runs[0]))]
    out = {"bench": "latency", "ops": args.ops, "repeat": args.repeat,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load": os.getloadavg()[0], "rows": rows, "runs": runs}  # fmt: skip
    if args.save:
        Path(args.save).write_text(json.dumps(out, indent=1) + "\n")
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"single-object latency, {args.ops} ops, zero-copy API, segment in another process")
    print(f"{'size':>8} {'store':<9} {'put p50':>8} {'p99':>8} {'get p50':>8} {'p99':>8} "
          f"{'put x mc':>8} {'get x mc':>8}")  # fmt: skip
    for r in rows:
        px, gx = r.get("put_p50_x_mc", 1.0), r.get("get_p50_x_mc", 1.0)
        print(f"{r['size'] >> 10:>6}Ki {r['store']:<9} {r['put_p50_us']:>8.0f} "
              f"{r['put_p99_us']:>8.0f} {r['get_p50_us']:>8.0f} {r['get_p99_us']:>8.0f} "
              f"{px:>8.2f} {gx:>8.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
