"""Benchmark: SSD tier put/get against raw O_DIRECT I/O of the same bytes.

For each object size, writes then reads `--total` bytes of objects (a) through
the tier: `put` (checksum, copy into a reused aligned staging buffer chunk by
chunk while earlier chunks are written, RocksDB index entry), then three reads:
`get_into` (into a caller buffer, chunks copied as they arrive), `acquire`
(zero-copy: the aligned read buffer itself) and `get` (a fresh `bytes`, whose
allocation faults in new pages), and (b)
the baseline measured in the same run: raw `os.pwritev` / `os.preadv` of the same
sizes on an O_DIRECT file from page-aligned buffers, with the same number of
1 MiB I/Os in flight and no copy, checksum or index. (a) and (b) alternate object
by object; the median over rounds is reported. Target: put and get_into >= 0.7x raw for >= 1 MiB.

    python bench/ssd_tier.py [--quick] [--json] [--dir DIR] [--sizes-mib 1,4,16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kvstore.tiers.direct_io import AlignedBuffer
from kvstore.tiers.ssd import SsdConfig, SsdTier
from kvstore.types import ObjectKey

TARGET = 0.7
MiB = 1 << 20
RAW_CHUNK = MiB  # the baseline's I/O size (fio-like: 1 MiB, --io-threads in flight)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=None, help="directory on the disk under test (default: /tmp)")
    p.add_argument("--sizes-mib", default="1,4,16", help="object sizes in MiB, comma separated")
    p.add_argument("--total-mib", type=int, default=None, help="bytes moved per size and round")
    p.add_argument("--rounds", type=int, default=None, help="alternating rounds (median taken)")
    p.add_argument("--io-threads", type=int, default=4, help="I/Os in flight, both sides")
    p.add_argument("--quick", action="store_true", help="short run: 64 MiB per size, 2 rounds")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args(argv)


class RawDirect:
    """The baseline: one O_DIRECT file, aligned buffers, 1 MiB I/Os from a pool."""

    def __init__(self, path: str, capacity: int, threads: int) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
        os.posix_fallocate(self.fd, 0, capacity)
        self.pool = ThreadPoolExecutor(threads)

    def _io(self, op: Callable[..., int], view: memoryview, offset: int) -> None:
        """One I/O inline for a single chunk, else every chunk on the pool at once."""
        if len(view) <= RAW_CHUNK:
            op(self.fd, [view], offset)
            return
        chunks = range(0, len(view), RAW_CHUNK)
        futures = [
            self.pool.submit(op, self.fd, [view[i : i + RAW_CHUNK]], offset + i) for i in chunks
        ]
        for fut in futures:
            fut.result()

    def write(self, view: memoryview, offset: int) -> None:
        self._io(os.pwritev, view, offset)

    def read(self, view: memoryview, offset: int) -> None:
        self._io(os.preadv, view, offset)

    def close(self) -> None:
        self.pool.shutdown()
        os.close(self.fd)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired_round(raw: RawDirect, tier: SsdTier, size: int, count: int, tag: int) -> dict:
    """Seconds per operation kind, summed over `count` objects. Baseline and tier
    alternate object by object, so the load of this shared machine hits both alike."""
    value = os.urandom(size)
    buf = AlignedBuffer(size)
    buf.view[:] = value
    out = memoryview(bytearray(size))
    keys = [ObjectKey(f"r{tag}-{size}-{i}") for i in range(count)]
    secs = dict.fromkeys(COLUMNS, 0.0)

    def acquire_release(key: ObjectKey) -> None:
        handle = tier.acquire(key)
        assert handle is not None
        handle.release()

    for i, key in enumerate(keys):  # who goes first alternates too
        pair = [
            ("raw_w", lambda i=i: raw.write(buf.view, i * size)),
            ("put", lambda key=key: tier.put(key, value)),
        ]
        for name, fn in pair if i % 2 else pair[::-1]:
            secs[name] += timed(fn)
    for i, key in enumerate(keys):
        reads = [
            ("raw_r", lambda i=i: raw.read(buf.view, i * size)),
            ("get_into", lambda key=key: tier.get_into(key, out)),
            ("acquire", lambda key=key: acquire_release(key)),
            ("get", lambda key=key: tier.get(key)),
        ]
        for name, fn in reads if i % 2 else reads[::-1]:
            secs[name] += timed(fn)
    assert bytes(out) == value
    for key in keys:
        tier.remove(key)
    buf.close()
    return secs


COLUMNS = ("raw_w", "put", "raw_r", "get_into", "acquire", "get")


def make_row(size: int, count: int, med: dict[str, float]) -> dict[str, object]:
    row: dict[str, object] = {"size_mib": size / MiB, "objects": count}
    row.update({name: round(med[name], 3) for name in COLUMNS})
    row["put_ratio"] = round(med["put"] / med["raw_w"], 3)
    for name in ("get_into", "acquire", "get"):
        row[f"{name}_ratio"] = round(med[name] / med["raw_r"], 3)
    return row


def measure_size(raw: RawDirect, tier: SsdTier, size: int, total: int, rounds: int) -> dict:
    count = max(1, total // size)
    samples: dict[str, list[float]] = {name: [] for name in COLUMNS}
    for r in range(rounds):
        for name, secs in paired_round(raw, tier, size, count, r).items():
            samples[name].append(count * size / secs / 1e9)
    return make_row(size, count, {k: statistics.median(v) for k, v in samples.items()})


def run(args: argparse.Namespace) -> dict[str, object]:
    total = (args.total_mib or (64 if args.quick else 256)) * MiB
    rounds = args.rounds or (3 if args.quick else 5)
    sizes = [int(float(s) * MiB) for s in args.sizes_mib.split(",")]
    root = tempfile.mkdtemp(prefix="ssd-bench-", dir=args.dir)
    try:
        raw = RawDirect(os.path.join(root, "raw.dat"), total, args.io_threads)
        tier = SsdTier(SsdConfig(os.path.join(root, "tier"), total, io_threads=args.io_threads))
        rows = [measure_size(raw, tier, size, total, rounds) for size in sizes]
        mode = tier.io_mode
        tier.close()
        raw.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    big = [r for r in rows if r["size_mib"] >= 1]  # type: ignore[operator]
    ok = all(r["put_ratio"] >= TARGET and r["get_into_ratio"] >= TARGET for r in big)  # type: ignore[operator]
    return {"bench": "ssd_tier", "io_mode": mode, "target_ratio": TARGET,
            "target_apis": ["put", "get_into"], "meets_target": ok, "rows": rows}  # fmt: skip


def print_table(result: dict[str, object]) -> None:
    print(f"SSD tier vs raw O_DIRECT, GB/s (median), tier I/O mode: {result['io_mode']}")
    print(f"{'MiB':>5} {'objs':>5} | {'raw W':>6} {'put':>6} {'x':>5} | {'raw R':>6}"
          f" {'get_into':>8} {'x':>5} {'acquire':>7} {'x':>5} {'get':>6} {'x':>5}")  # fmt: skip
    for r in result["rows"]:  # type: ignore[attr-defined]
        print(f"{r['size_mib']:>5g} {r['objects']:>5} | {r['raw_w']:>6.2f} {r['put']:>6.2f}"
              f" {r['put_ratio']:>5.2f} | {r['raw_r']:>6.2f} {r['get_into']:>8.2f}"
              f" {r['get_into_ratio']:>5.2f} {r['acquire']:>7.2f} {r['acquire_ratio']:>5.2f}"
              f" {r['get']:>6.2f} {r['get_ratio']:>5.2f}")  # fmt: skip
    verdict = "meets" if result["meets_target"] else "MISSES"
    print(f"target: put and get_into >= {TARGET}x raw for objects >= 1 MiB: {verdict}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
