"""Tiered pool bench: the pool's DRAM and SSD tiers through the client, across processes.

A `kvstore master` and a `kvstore node` (DRAM segment + SSD segment: the SSD tier's
O_DIRECT slab and RocksDB index) run as processes; this process is the client.
Baselines are measured in this run, before any store process starts (nothing else
running): memcpy (np.copyto of the same sizes) and raw O_DIRECT reads/writes of
the same sizes on a file in the same directory as the SSD segment.

Rows:
- DRAM-tier get (shm), checksums verified and not, vs memcpy; batched, vs memcpy of
  the same objects into distinct destinations (the batch's own memory traffic: one
  cache-hot destination reused 64 times is not what a batch does);
- SSD-tier put and get (TCP to the node, O_DIRECT on the node) vs raw O_DIRECT; the
  get both as a repeated get of the same objects (their locations cached: no master
  call) and with a lookup per call (a client with its location cache off);
- offload: DRAM -> SSD bytes/s while a put burst crosses the DRAM watermark, vs raw
  O_DIRECT write;
- Zipf workload over a working set 4x DRAM: hit ratio and mean get latency for
  tiered (DRAM + SSD, offload + promotion), DRAM only (same DRAM), and one flat
  tier of the same total capacity (all DRAM).

    python bench/pool_tiers.py [--quick] [--dir DIR] [--out bench/out/pool_tiers] [--only tiers]

Writes <out>.json and <out>.png and prints a table. Targets (issue 8): SSD get/put
>= 0.7x raw O_DIRECT at >= 1 MiB; DRAM get >= 0.7x memcpy with checksums on; Zipf
tiered hit ratio >= 0.95x the flat tier's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ssd_tier import RawDirect
from kvstore.client import Client
from kvstore.errors import NotFoundError
from kvstore.types import Tier

MIB = 1 << 20
RAW_DEPTH = 16  # I/Os in flight for the raw baseline: what the pool's data path reaches


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a short run (smaller totals)")
    p.add_argument("--dir", default=None, help="directory on the disk under test")
    p.add_argument("--out", default="bench/out/pool_tiers", help="output path stem")
    p.add_argument("--rounds", type=int, default=3, help="repeats per row (median)")
    p.add_argument(
        "--only", choices=("all", "tiers"), default="all",
        help="tiers: only the per-size rows (one per call and batched), no offload or Zipf",
    )  # fmt: skip
    return p.parse_args(argv)


# ---- processes ---------------------------------------------------------------------


@dataclass
class Pool:
    """A master and one node as processes; `address` of the master."""

    address: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _ready(proc: subprocess.Popen[bytes], prefix: bytes) -> bytes:
    assert proc.stdout is not None
    for _ in range(1000):
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"process exited before {prefix!r}")
        if line.startswith(prefix):
            return line
    raise RuntimeError(f"no {prefix!r} line")


@contextlib.contextmanager
def pool(dram_mib: float, ssd_mib: float, ssd_dir: str, **master: object) -> Iterator[Pool]:
    p = Pool()
    py = sys.executable
    try:
        args = [py, "-m", "kvstore.master", "--listen", "127.0.0.1:0"]
        for name, value in master.items():
            args += ["--set", f"{name}={value}"]
        m = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        p.procs.append(m)
        p.address = _ready(m, b"kvstore master listening on ").split()[4].decode()
        node = [py, "-m", "kvstore.node", "--master", p.address, "--node-id", "bench-node",
                "--dram-mib", str(dram_mib)]  # fmt: skip
        if ssd_mib:
            node += ["--ssd-dir", ssd_dir, "--ssd-mib", str(ssd_mib)]
        n = subprocess.Popen(node, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        p.procs.append(n)
        _ready(n, b"kvstore node ")
        yield p
    finally:
        p.close()
        shutil.rmtree(ssd_dir, ignore_errors=True)  # the slab and index: nothing left behind


def fresh_dir(root: str) -> str:
    return tempfile.mkdtemp(prefix="pool-tiers-", dir=root)


# ---- baselines ---------------------------------------------------------------------


def median_rate(nbytes: int, fn: Callable[[], object], rounds: int) -> float:
    """GB/s of `fn` moving `nbytes`, median of `rounds` after one untimed warm-up (the
    first read of a segment maps it: a one-time cost per client, not per operation)."""
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return nbytes / float(np.median(times)) / 1e9


def memcpy_rate(size: int, count: int, rounds: int) -> float:
    src = [np.random.default_rng(i).integers(0, 256, size, np.uint8) for i in range(count)]
    dst = np.empty(size, np.uint8)

    def run() -> None:
        for s in src:
            np.copyto(dst, s)

    return median_rate(size * count, run, rounds)


def memcpy_scatter_rate(size: int, count: int, rounds: int) -> float:
    """memcpy of `count` objects each into its own slice of one buffer: the memory
    traffic of a batched get (every destination distinct, none of them cache-hot),
    the baseline of the batched DRAM row."""
    src = [np.random.default_rng(i).integers(0, 256, size, np.uint8) for i in range(count)]
    big = np.empty(size * count, np.uint8)
    dst = [big[i * size : (i + 1) * size] for i in range(count)]

    def run() -> None:
        for s, d in zip(src, dst, strict=True):
            np.copyto(d, s)

    return median_rate(size * count, run, rounds)


def page_aligned(size: int) -> np.ndarray:
    """`size` bytes starting on a page boundary, as O_DIRECT needs."""
    raw = np.empty(size + 4096, np.uint8)
    at = (-raw.ctypes.data) % 4096
    return raw[at : at + size]


def raw_direct_rates(
    root: str, size: int, count: int, rounds: int
) -> tuple[float, float, float, float]:
    """Raw O_DIRECT write and read GB/s: one object at a time (large ones split into
    1 MiB I/Os, all in flight), and all objects at once, RAW_DEPTH I/Os in flight. The
    pool keeps as many in flight: 4 TCP connections x 4 slab I/O threads on the node."""
    where = fresh_dir(root)
    path = os.path.join(where, "raw.dat")
    raw = RawDirect(path, size * count, RAW_DEPTH)
    view = memoryview(page_aligned(size))
    view[:] = os.urandom(size)
    try:
        write = median_rate(
            size * count, lambda: [raw.write(view, i * size) for i in range(count)], rounds
        )
        read = median_rate(
            size * count, lambda: [raw.read(view, i * size) for i in range(count)], rounds
        )

        def all_at_once(op: Callable[..., int]) -> Callable[[], None]:
            def run() -> None:
                for f in [raw.pool.submit(op, raw.fd, [view], i * size) for i in range(count)]:
                    f.result()

            return run

        write16 = median_rate(size * count, all_at_once(os.pwritev), rounds)
        read16 = median_rate(size * count, all_at_once(os.preadv), rounds)
    finally:
        raw.close()
        shutil.rmtree(where, ignore_errors=True)
    return write, read, write16, read16


# ---- pool rows ---------------------------------------------------------------------


def tier_rows(root: str, size: int, count: int, rounds: int) -> dict[str, float]:
    """Client put/get GB/s: DRAM get (checksum on/off), SSD put and get."""
    total = size * count
    values = [os.urandom(size) for _ in range(count)]
    out = np.empty(size, np.uint8)
    big = np.empty(total, np.uint8)  # one slice per key, for the batched rows
    outs = [big[i * size : (i + 1) * size] for i in range(count)]
    mib = total * 4 / MIB + 16
    # No watermark movement and no promotion: the SSD rows must read the SSD replica
    # (after two reads an SSD object would otherwise get a DRAM copy and be read there).
    opts = {"high_watermark": 1.0, "low_watermark": 1.0, "promote_after": 0}
    with (
        pool(mib, mib, fresh_dir(root), **opts) as p,
        Client(p.address) as c,
        Client(p.address, verify_dram=False) as fast,
        Client(p.address, location_cache_entries=0) as uncached,
    ):
        c.register_buffer(out)
        c.register_buffer(big)
        # The raw rows read into (and write from) a page-aligned buffer, as O_DIRECT
        # needs; numpy's own buffers start 16 bytes past a page, so the pool stages them
        # through an aligned copy. The "aligned" rows give the pool the raw rows' kind of
        # buffer: their ratio is the pool's own overhead, the others' adds that copy.
        aout = page_aligned(size)
        asrc = page_aligned(size)
        asrc[:] = np.frombuffer(values[0], np.uint8)
        c.register_buffer(aout)
        c.register_buffer(asrc)
        fast.register_buffer(out)
        uncached.register_buffer(out)
        for i, v in enumerate(values):
            c.put(f"d{i}", v, tier=Tier.DRAM)
        keys = [f"d{i}" for i in range(count)]
        dram_on = median_rate(total, lambda: [c.get_into(k, out) for k in keys], rounds)
        dram_off = median_rate(total, lambda: [fast.get_into(k, out) for k in keys], rounds)
        # One object per call against raw O_DIRECT, interleaved round by round: this
        # host's disk swings 0.5-2 GB/s from minute to minute (burst credits), far more
        # than the pool's overhead, so a baseline measured minutes earlier says little.
        # Each round times `count` raw writes (then reads) of the same size on a file
        # beside the slab, then the pool's; the ratio is the median of the rounds' own.
        raw_dir = fresh_dir(root)
        raw = RawDirect(os.path.join(raw_dir, "raw.dat"), total, RAW_DEPTH)
        rview = memoryview(page_aligned(size))
        rview[:] = values[0]

        def timed(fn: Callable[[], object]) -> float:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start

        put_t, put_x, aput_x = [], [], []
        for r in range(rounds):
            if r:  # keep the segment from filling up (not timed)
                for i in range(count):
                    c.remove(f"s{r - 1}-{i}", force=True)
                    c.remove(f"a{r - 1}-{i}", force=True)
            raw_t = timed(lambda: [raw.write(rview, i * size) for i in range(count)])
            put_t.append(timed(lambda r=r: [c.put(f"s{r}-{i}", v, tier=Tier.SSD)
                                            for i, v in enumerate(values)]))  # fmt: skip
            put_x.append(raw_t / put_t[-1])
            aput_t = timed(lambda r=r: [c.put_from(f"a{r}-{i}", asrc, tier=Tier.SSD)
                                        for i in range(count)])  # fmt: skip
            aput_x.append(raw_t / aput_t)
        for i in range(count):
            c.remove(f"a{rounds - 1}-{i}", force=True)
        ssd_put_rate = total / float(np.median(put_t)) / 1e9
        last = [f"s{rounds - 1}-{i}" for i in range(count)]
        # A repeated get of an SSD object reads its cached location (no master call; its
        # reads are reported with the next lookup); a first get, or one with the
        # location cache off, pays a lookup each time.
        for fn in (lambda: [c.get_into(k, out) for k in last],
                   lambda: [uncached.get_into(k, out) for k in last]):  # fmt: skip
            fn()  # warm-up: the first read of a segment maps it (once per client)
        get_t, get_x, look_t, look_x, aget_x = [], [], [], [], []
        try:
            for _ in range(rounds):
                raw_t = timed(lambda: [raw.read(rview, i * size) for i in range(count)])
                get_t.append(timed(lambda: [c.get_into(k, out) for k in last]))
                look_t.append(timed(lambda: [uncached.get_into(k, out) for k in last]))
                aget_t = timed(lambda: [c.get_into(k, aout) for k in last])
                get_x.append(raw_t / get_t[-1])
                look_x.append(raw_t / look_t[-1])
                aget_x.append(raw_t / aget_t)
        finally:
            raw.close()
            shutil.rmtree(raw_dir, ignore_errors=True)
        ssd_get_rate = total / float(np.median(get_t)) / 1e9
        ssd_get_lookup = total / float(np.median(look_t)) / 1e9
        dram_batch = median_rate(total, lambda: c.batch_get_into(keys, outs), rounds)
        ssd_batch_get = median_rate(total, lambda: c.batch_get_into(last, outs), rounds)
        times = []
        for r in range(rounds):
            for i in range(count):
                c.remove(f"s{rounds - 1}-{i}" if r == 0 else f"b{r - 1}-{i}", force=True)
            items = [(f"b{r}-{i}", v) for i, v in enumerate(values)]
            start = time.perf_counter()
            errors = c.batch_put(items, tier=Tier.SSD)
            times.append(time.perf_counter() - start)
            assert not any(errors), errors
        ssd_batch_put = total / float(np.median(times)) / 1e9
    return {
        "dram_get_checksum": dram_on, "dram_get_no_checksum": dram_off,
        "ssd_put": ssd_put_rate, "ssd_get": ssd_get_rate, "ssd_get_lookup": ssd_get_lookup,
        "ssd_put_vs_raw_interleaved": float(np.median(put_x)),
        "ssd_get_vs_raw_interleaved": float(np.median(get_x)),
        "ssd_get_lookup_vs_raw_interleaved": float(np.median(look_x)),
        "ssd_put_aligned_vs_raw_interleaved": float(np.median(aput_x)),
        "ssd_get_aligned_vs_raw_interleaved": float(np.median(aget_x)),
        "dram_batch_get": dram_batch,
        "ssd_batch_put": ssd_batch_put, "ssd_batch_get": ssd_batch_get,
    }  # fmt: skip


def offload_rate(root: str, total_mib: int) -> dict[str, float]:
    """Bytes/s the node moves DRAM -> SSD: DRAM is filled to 85% (below its 90% high
    watermark), then one more put crosses it and the tier drains to 5%; timed from that
    put until no move is left."""
    dram = total_mib / 0.85
    opts = {"high_watermark": 0.9, "low_watermark": 0.05, "move_bytes_per_s": 0}
    with pool(dram, total_mib * 2, fresh_dir(root), **opts) as p, Client(p.address) as c:
        value = os.urandom(MIB)
        for i in range(total_mib):
            c.put(f"o{i}", value)
        assert c.stats().get("offloads", 0) == 0
        start = time.perf_counter()
        c.put("trigger", os.urandom(int(dram * 0.07 * MIB)))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # poll the other process's counters
            s = c.stats()
            if s.get("moves_in_flight", 0) == 0 and s.get("offloads", 0) > 0:
                break
            time.sleep(0.005)
        elapsed = time.perf_counter() - start
        stats = c.stats()
    moved = sum(
        g.get("offloads_in", 0) for g in stats.get("segments", []) if g.get("tier") == Tier.SSD
    )
    nbytes = moved * MIB
    return {"offloaded_objects": float(moved), "gbps": nbytes / elapsed / 1e9}


def zipf_keys(n_keys: int, n_ops: int, seed: int, a: float = 1.2) -> list[int]:
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, n_keys + 1, dtype=np.float64)
    p = ranks**-a
    p /= p.sum()
    perm = rng.permutation(n_keys)  # hot keys scattered over the key space
    return [int(perm[i]) for i in rng.choice(n_keys, size=n_ops, p=p)]


def zipf_run(
    root: str, dram_mib: float, ssd_mib: float, keys: list[int], size: int
) -> dict[str, float]:
    """Cache workload: get; on a miss, put. Hit ratio and mean get latency (ms)."""
    value = os.urandom(size)
    out = np.empty(size, np.uint8)
    hits = 0
    lat: list[float] = []
    with pool(dram_mib, ssd_mib, fresh_dir(root)) as p, Client(p.address) as c:
        c.register_buffer(out)
        for k in keys:
            start = time.perf_counter()
            try:
                c.get_into(f"z{k}", out)
                hits += 1
            except NotFoundError:
                c.put(f"z{k}", value)
            lat.append(time.perf_counter() - start)
        stats = c.stats()
    return {
        "hit_ratio": hits / len(keys), "mean_ms": 1000 * float(np.mean(lat)),
        "offloads": float(stats.get("offloads", 0)),
        "promotions": float(stats.get("promotions", 0)),
        "evictions": float(stats.get("evictions", 0)),
    }  # fmt: skip


# ---- report ------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, object]:
    root = args.dir or tempfile.gettempdir()
    count_mib = 32 if args.quick else 128
    sizes = [MIB, 16 * MIB]
    result: dict[str, object] = {"sizes": {}, "dir": root}
    for size in sizes:  # baselines first, with no store process alive
        count = max(2, count_mib * MIB // size)
        memcpy = memcpy_rate(size, count, args.rounds)
        scatter = memcpy_scatter_rate(size, count, args.rounds)
        raw_w, raw_r, raw_w16, raw_r16 = raw_direct_rates(root, size, count, args.rounds)
        rows = tier_rows(root, size, count, args.rounds)
        result["sizes"][str(size)] = {  # type: ignore[index]
            "memcpy": memcpy, "memcpy_scatter": scatter,
            "raw_direct_write": raw_w, "raw_direct_read": raw_r,
            "raw_direct_write_qd16": raw_w16, "raw_direct_read_qd16": raw_r16, **rows,
            "dram_get_vs_memcpy": rows["dram_get_checksum"] / memcpy,
            "dram_get_no_checksum_vs_memcpy": rows["dram_get_no_checksum"] / memcpy,
            "ssd_put_vs_raw": rows["ssd_put"] / raw_w, "ssd_get_vs_raw": rows["ssd_get"] / raw_r,
            "ssd_get_lookup_vs_raw": rows["ssd_get_lookup"] / raw_r,
            "dram_batch_get_vs_memcpy": rows["dram_batch_get"] / scatter,
            "ssd_batch_put_vs_raw": rows["ssd_batch_put"] / raw_w16,
            "ssd_batch_get_vs_raw": rows["ssd_batch_get"] / raw_r16,
        }  # fmt: skip
    if args.only == "tiers":
        return result
    raw_w = raw_direct_rates(root, MIB, 64, args.rounds)[0]
    off = offload_rate(root, 32 if args.quick else 96)
    result["offload"] = {**off, "raw_direct_write": raw_w, "vs_raw": off["gbps"] / raw_w}
    n_keys, size = (256, 64 << 10) if args.quick else (512, 64 << 10)
    ws_mib = n_keys * size / MIB  # working set
    keys = zipf_keys(n_keys, 2000 if args.quick else 6000, seed=7)
    dram, ssd = ws_mib / 4, ws_mib / 2
    zipf = {
        "tiered": zipf_run(root, dram, ssd, keys, size),
        "dram_only": zipf_run(root, dram, 0, keys, size),
        "flat": zipf_run(root, dram + ssd, 0, keys, size),
    }
    zipf["tiered_vs_flat_hit_ratio"] = zipf["tiered"]["hit_ratio"] / zipf["flat"]["hit_ratio"]
    result["zipf"] = {"working_set_mib": ws_mib, "dram_mib": dram, "ssd_mib": ssd, **zipf}
    return result


def print_table(r: dict[str, object]) -> None:
    print("pool tiers through the client (GB/s, median); baselines measured alone first")
    print(f"{'size':>8} {'memcpy':>7} {'DRAM get':>9} {'(no csum)':>9} {'x':>5}"
          f" {'rawW':>6} {'SSD put':>8} {'x':>5} {'rawR':>6} {'SSD get':>8} {'x':>5}")  # fmt: skip
    for size, row in r["sizes"].items():  # type: ignore[attr-defined]
        print(
            f"{int(size) // MIB:>6}Mi {row['memcpy']:7.2f} {row['dram_get_checksum']:9.2f} "
            f"{row['dram_get_no_checksum']:9.2f} {row['dram_get_vs_memcpy']:5.2f} "
            f"{row['raw_direct_write']:6.2f} {row['ssd_put']:8.2f} {row['ssd_put_vs_raw']:5.2f} "
            f"{row['raw_direct_read']:6.2f} {row['ssd_get']:8.2f} {row['ssd_get_vs_raw']:5.2f}"
        )
    for size, row in r["sizes"].items():  # type: ignore[attr-defined]
        print(
            f"{int(size) // MIB:>6}Mi SSD get with a lookup per call (location cache off): "
            f"{row['ssd_get_lookup']:.2f} GB/s, {row['ssd_get_lookup_vs_raw']:.2f}x raw; "
            f"interleaved with raw rounds: put {row['ssd_put_vs_raw_interleaved']:.2f}x, "
            f"get {row['ssd_get_vs_raw_interleaved']:.2f}x, "
            f"get with a lookup {row['ssd_get_lookup_vs_raw_interleaved']:.2f}x; "
            f"page-aligned buffers (as raw's): put "
            f"{row['ssd_put_aligned_vs_raw_interleaved']:.2f}x, "
            f"get {row['ssd_get_aligned_vs_raw_interleaved']:.2f}x"
        )
    print("batched (one call for all keys):")
    for size, row in r["sizes"].items():  # type: ignore[attr-defined]
        print(
            f"{int(size) // MIB:>6}Mi DRAM get {row['dram_batch_get']:6.2f} "
            f"({row['dram_batch_get_vs_memcpy']:.2f}x memcpy to distinct buffers "
            f"{row['memcpy_scatter']:.2f})  SSD put {row['ssd_batch_put']:6.2f} "
            f"({row['ssd_batch_put_vs_raw']:.2f}x raw qd16 {row['raw_direct_write_qd16']:.2f})  "
            f"SSD get {row['ssd_batch_get']:6.2f} ({row['ssd_batch_get_vs_raw']:.2f}x raw qd16 "
            f"{row['raw_direct_read_qd16']:.2f})"
        )
    if "offload" not in r:
        return
    off = r["offload"]
    print(f"offload DRAM->SSD: {off['gbps']:.2f} GB/s ({off['offloaded_objects']:.0f} x 1 MiB), "  # type: ignore[index]
          f"{off['vs_raw']:.2f}x raw O_DIRECT write")  # type: ignore[index]  # fmt: skip
    z = r["zipf"]
    print(f"Zipf, working set {z['working_set_mib']:.0f} MiB = 4x DRAM:")  # type: ignore[index]
    for name in ("tiered", "dram_only", "flat"):
        row = z[name]  # type: ignore[index]
        print(f"  {name:>10}: hit ratio {row['hit_ratio']:.3f}, mean get {row['mean_ms']:.3f} ms, "
              f"offloads {row['offloads']:.0f}, promotions {row['promotions']:.0f}")  # fmt: skip
    print(f"  tiered / flat hit ratio: {z['tiered_vs_flat_hit_ratio']:.3f}")  # type: ignore[index]


def plot(r: dict[str, object], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    rows = r["sizes"]  # type: ignore[assignment]
    labels = [f"{int(s) // MIB} MiB" for s in rows]  # type: ignore[union-attr]
    names = ["dram_get_vs_memcpy", "dram_get_no_checksum_vs_memcpy", "ssd_put_vs_raw",
             "ssd_get_vs_raw", "dram_batch_get_vs_memcpy", "ssd_batch_put_vs_raw",
             "ssd_batch_get_vs_raw"]  # fmt: skip
    x = np.arange(len(labels))
    for j, name in enumerate(names):
        ax1.bar(x + j * 0.12, [rows[s][name] for s in rows], 0.12, label=name)  # type: ignore[index]
    ax1.axhline(0.7, color="k", ls="--", lw=1)
    ax1.set_xticks(x + 0.36, labels)
    ax1.set_ylabel("ratio to baseline (same run)")
    ax1.legend(fontsize=7)
    if "zipf" not in r:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        return
    z = r["zipf"]  # type: ignore[assignment]
    modes = ["tiered", "dram_only", "flat"]
    ax2.bar(modes, [z[m]["hit_ratio"] for m in modes])  # type: ignore[index]
    ax2.set_ylabel("hit ratio (Zipf, working set 4x DRAM)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(result, indent=2))
    plot(result, args.out + ".png")
    print_table(result)
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
