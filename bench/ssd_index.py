"""Benchmark: the SSD tier's index binding (rocksdict) with and without its WAL.

For each write mode (WAL off; WAL on, the chosen one; WAL on + fsync per write)
it measures index puts of 32-byte entries (ops/s, p50/p99 microseconds) and
then durability: a child process puts entries and prints each key after its
put returns; the parent SIGKILLs it mid-stream, reopens the database and counts
printed keys that are missing. The ratio column is put rate against WAL off,
measured in the same run.

    python bench/ssd_index.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from rocksdict import Options, Rdict, WriteOptions

MODES = {"wal_off": (True, False), "wal_on": (False, False), "wal_sync": (False, True)}
ENTRY = bytes(32)


def open_db(path: str, mode: str) -> tuple[Rdict, WriteOptions]:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    write = WriteOptions()
    write.disable_wal, write.sync = MODES[mode]
    return Rdict(path, options), write


def put_rate(path: str, mode: str, n: int) -> dict[str, float]:
    db, write = open_db(path, mode)
    lat = []
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        db.put(f"obj-{i}".encode(), ENTRY, write)
        lat.append(time.perf_counter() - t)
    total = time.perf_counter() - start
    db.close()
    lat.sort()
    return {
        "ops_per_s": round(n / total),
        "p50_us": round(statistics.median(lat) * 1e6, 1),
        "p99_us": round(lat[int(len(lat) * 0.99)] * 1e6, 1),
    }


def child(path: str, mode: str) -> None:
    """Put and print forever (until killed)."""
    db, write = open_db(path, mode)
    for i in range(10_000_000):
        db.put(f"obj-{i}".encode(), ENTRY, write)
        print(i, flush=True)


def lost_after_kill(path: str, mode: str, puts: int) -> int:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", path, mode], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    done = -1
    while done < puts:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"child exited early ({mode})")
        done = int(line)
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate(timeout=30)
    done = max([done, *(int(x) for x in rest.split())])
    db, _ = open_db(path, mode)
    lost = sum(db.get(f"obj-{i}".encode()) is None for i in range(done + 1))
    db.close()
    return lost


def run(quick: bool) -> dict[str, object]:
    n, kill_after = (2_000, 1_000) if quick else (20_000, 5_000)
    root = tempfile.mkdtemp(prefix="ssd-index-bench-")
    rows = []
    try:
        for mode in MODES:
            count = n // 10 if mode == "wal_sync" else n
            row: dict[str, object] = {"mode": mode, "puts": count}
            row.update(put_rate(os.path.join(root, f"rate-{mode}"), mode, count))
            row["lost_after_kill9"] = lost_after_kill(
                os.path.join(root, f"kill-{mode}"), mode, kill_after
            )
            rows.append(row)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = rows[0]["ops_per_s"]
    for row in rows:
        row["ratio_vs_wal_off"] = round(row["ops_per_s"] / base, 3)  # type: ignore[operator]
    return {"bench": "ssd_index", "binding": "rocksdict", "chosen": "wal_on", "rows": rows}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()
    result = run(args.quick)
    if args.json:
        print(json.dumps(result))
        return
    print("rocksdict index writes, 32-byte entries")
    print(f"{'mode':>9} {'puts':>6} {'ops/s':>8} {'p50 us':>7} {'p99 us':>7} {'x':>6} {'lost':>5}")
    for r in result["rows"]:  # type: ignore[attr-defined]
        cells = (r["mode"], r["puts"], r["ops_per_s"], r["p50_us"], r["p99_us"])
        line = "{:>9} {:>6} {:>8} {:>7} {:>7}".format(*cells)
        print(f"{line} {r['ratio_vs_wal_off']:>6} {r['lost_after_kill9']:>5}")
    print("lost = keys whose put had returned (and was printed) but were gone after kill -9")


if __name__ == "__main__":
    main()
