"""Benchmark: DRAM tier put / get_into / get against memcpy of the same bytes.

For each object size, `--total` bytes of objects go through a DramTier (one
shared-memory segment): `put` (reserve, copy into the segment, commit), then
`get_into` (copy out into a caller buffer) and `get` (a fresh `bytes`). The
baseline, measured in the same run and alternated object by object so machine
noise hits both alike, is a single-thread memcpy (numpy copyto) of the same
sizes to and from the same offsets of one large pre-faulted buffer (the copies
the tier itself must make, with no bookkeeping). The median over rounds is reported.
The baseline buffer is allocated without transparent huge pages: /dev/shm here
cannot have them (shmem_enabled=never), and a THP-backed baseline measures TLB
reach rather than the store (`--thp-baseline` shows that figure).
Target: put and get_into >= 0.7x memcpy for objects >= 1 MiB.

    python bench/dram_tier.py [--quick] [--json] [--sizes-mib 0.0625,1,16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
from numpy._core.multiarray import _set_madvise_hugepage

from kvstore.tiers.dram import DramConfig, DramTier
from kvstore.types import ObjectKey

TARGET = 0.7
MiB = 1 << 20
COLUMNS = ("memcpy_w", "put", "memcpy_r", "get_into", "get")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes-mib", default="0.0625,1,16", help="object sizes in MiB, comma separated"
    )
    p.add_argument("--total-mib", type=int, default=None, help="bytes moved per size and round")
    p.add_argument("--rounds", type=int, default=None, help="rounds (median taken)")
    p.add_argument("--quick", action="store_true", help="short run: 64 MiB per size, 3 rounds")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--thp-baseline", action="store_true", help="baseline buffer with huge pages")
    return p.parse_args(argv)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def one_round(
    tier: DramTier, arena: np.ndarray, size: int, count: int, tag: int
) -> dict[str, float]:
    """Seconds per operation kind summed over `count` objects, baseline interleaved."""
    src = np.random.default_rng(tag).integers(0, 256, size, dtype=np.uint8)
    out_np = np.empty(size, dtype=np.uint8)
    out = memoryview(out_np)
    value = memoryview(src)
    keys = [ObjectKey(f"r{tag}-{size}-{i}") for i in range(count)]
    slots = [arena[i * size : (i + 1) * size] for i in range(count)]
    secs = dict.fromkeys(COLUMNS, 0.0)
    for key, slot in zip(keys, slots, strict=True):
        secs["memcpy_w"] += timed(lambda slot=slot: np.copyto(slot, src))
        secs["put"] += timed(lambda key=key: tier.put(key, value))
    for key, slot in zip(keys, slots, strict=True):
        secs["memcpy_r"] += timed(lambda slot=slot: np.copyto(out_np, slot))
        secs["get_into"] += timed(lambda key=key: tier.get_into(key, out))
        secs["get"] += timed(lambda key=key: tier.get(key))
    if out.tobytes() != src.tobytes():
        raise AssertionError("DRAM tier returned different bytes")
    for key in keys:
        tier.remove(key)
    return secs


def measure_size(
    tier: DramTier, arena: np.ndarray, size: int, total: int, rounds: int
) -> dict[str, object]:
    count = max(1, total // size)
    samples: dict[str, list[float]] = {name: [] for name in COLUMNS}
    for r in range(rounds):
        for name, secs in one_round(tier, arena, size, count, r).items():
            samples[name].append(count * size / secs / 1e9)
    med = {k: statistics.median(v) for k, v in samples.items()}
    row: dict[str, object] = {"size_mib": size / MiB, "objects": count}
    row.update({name: round(med[name], 3) for name in COLUMNS})
    row["put_ratio"] = round(med["put"] / med["memcpy_w"], 3)
    for name in ("get_into", "get"):
        row[f"{name}_ratio"] = round(med[name] / med["memcpy_r"], 3)
    return row


def run(args: argparse.Namespace) -> dict[str, object]:
    total = (args.total_mib or (64 if args.quick else 256)) * MiB
    rounds = args.rounds or (3 if args.quick else 5)
    sizes = [int(float(s) * MiB) for s in args.sizes_mib.split(",")]
    capacity = total + 16 * MiB  # every object of a round fits: no eviction in the timings
    _set_madvise_hugepage(args.thp_baseline)
    arena = np.ones(total, dtype=np.uint8)  # pre-faulted, like the populated segment
    with DramTier(DramConfig(capacity_bytes=capacity)) as tier:
        rows = [measure_size(tier, arena, size, total, rounds) for size in sizes]
    big = [r for r in rows if r["size_mib"] >= 1]  # type: ignore[operator]
    ok = all(r["put_ratio"] >= TARGET and r["get_into_ratio"] >= TARGET for r in big)  # type: ignore[operator]
    return {"bench": "dram_tier", "baseline": "memcpy (numpy copyto, 1 thread, same offsets)",
            "baseline_huge_pages": args.thp_baseline,
            "target_ratio": TARGET, "target_apis": ["put", "get_into"], "meets_target": ok,
            "rows": rows}  # fmt: skip


def print_table(result: dict[str, object]) -> None:
    print("DRAM tier vs memcpy, GB/s (median)")
    print(f"{'MiB':>7} {'objs':>5} | {'memcpy W':>8} {'put':>6} {'x':>5} | {'memcpy R':>8}"
          f" {'get_into':>8} {'x':>5} {'get':>6} {'x':>5}")  # fmt: skip
    for r in result["rows"]:  # type: ignore[attr-defined]
        print(f"{r['size_mib']:>7g} {r['objects']:>5} | {r['memcpy_w']:>8.2f} {r['put']:>6.2f}"
              f" {r['put_ratio']:>5.2f} | {r['memcpy_r']:>8.2f} {r['get_into']:>8.2f}"
              f" {r['get_into_ratio']:>5.2f} {r['get']:>6.2f} {r['get_ratio']:>5.2f}")  # fmt: skip
    verdict = "meets" if result["meets_target"] else "MISSES"
    print(f"target: put and get_into >= {TARGET}x memcpy for objects >= 1 MiB: {verdict}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
