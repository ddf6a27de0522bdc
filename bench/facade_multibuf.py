"""The Mooncake facade's multi-buffer puts and gets (what vLLM's MooncakeStoreConnector
and SGLang's Mooncake backend call): 8 buffers of 128 KiB per key, scattered as a paged
KV cache lays them out (key b's buffers are layer 0..7 of block b, one layer's blocks
apart), against memcpy of the same bytes in the same run.

Two facade paths, interleaved: `zero-copy` (each buffer moves straight between the
pool and the caller's memory, kvstore.compat.mooncake_sg) and `staged` (the path before
it: the buffers joined into one staging buffer for a put, a get read into one and
scattered; `multi_zero_copy = False`). Baseline: memcpy of each key's 8 buffers into
one contiguous destination (numpy, this process), the copy a staged put adds. Two
placements: `node` (a `kvstore node` process on this host lends DRAM: shared-memory
transfers, the storage-node placement SGLang and LMCache use) and `lent` (the client
lends its own segment, `global_segment_size`, vLLM's embedded mode: memcpy in place).

    python bench/facade_multibuf.py [--keys 32] [--repeats 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "bench"))

from shm_fd import pool  # noqa: E402  (a master, with or without a DRAM node)

from kvstore.compat.mooncake import MooncakeDistributedStore  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
LAYERS, PART = 8, 128 * KiB


def timed(runs: dict[str, Callable[[int], None]], repeats: int) -> dict[str, float]:
    """Median seconds per runner; one warm-up each, then the repeats interleaved."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run(-1)
    for rep in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run(rep)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def measure(master: str, segment: int, n_keys: int, repeats: int) -> dict[str, float]:
    """GB/s of memcpy, and of put and get on both facade paths."""
    src = np.random.default_rng(1).integers(0, 255, (LAYERS, n_keys, PART), dtype=np.uint8)
    dst = np.zeros_like(src)
    flat = np.zeros((n_keys, LAYERS * PART), dtype=np.uint8)
    store = MooncakeDistributedStore()
    code = store.setup("localhost", "P2PHANDSHAKE", segment, 16 * MiB, "tcp", "", master)
    assert code == 0, f"setup: {code}"
    try:
        for a in (src, dst):
            assert store.register_buffer(a.ctypes.data, a.nbytes) == 0
        ptrs = [[src[layer, k].ctypes.data for layer in range(LAYERS)] for k in range(n_keys)]
        optrs = [[dst[layer, k].ctypes.data for layer in range(LAYERS)] for k in range(n_keys)]
        sizes = [[PART] * LAYERS] * n_keys
        nbytes = src.nbytes

        def memcpy(rep: int) -> None:
            for k in range(n_keys):
                for layer in range(LAYERS):
                    flat[k, layer * PART : (layer + 1) * PART] = src[layer, k]

        def put(zero_copy: bool) -> Callable[[int], None]:
            def run(rep: int) -> None:
                store.multi_zero_copy = zero_copy
                keys = [f"mb-{zero_copy}-{rep}-{k}" for k in range(n_keys)]
                assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0] * n_keys

            return run

        def get(zero_copy: bool) -> Callable[[int], None]:
            keys = [f"mb-get-{k}" for k in range(n_keys)]

            def run(rep: int) -> None:
                store.multi_zero_copy = zero_copy
                if rep < 0:  # the warm-up checks the bytes
                    dst[:] = 0
                got = store.batch_get_into_multi_buffers(keys, optrs, sizes)
                assert got == [LAYERS * PART] * n_keys, got[:3]
                if rep < 0:
                    assert np.array_equal(dst, src)

            return run

        store.multi_zero_copy = True
        get_keys = [f"mb-get-{k}" for k in range(n_keys)]
        assert store.batch_put_from_multi_buffers(get_keys, ptrs, sizes) == [0] * n_keys
        puts = timed({"memcpy": memcpy, "staged": put(False), "zero-copy": put(True)}, repeats)
        store.remove_by_regex("^mb-(True|False)-", True)
        gets = timed({"staged": get(False), "zero-copy": get(True)}, repeats)
        return {
            "memcpy_gbps": nbytes / puts["memcpy"] / 1e9,
            "put_staged_gbps": nbytes / puts["staged"] / 1e9,
            "put_zero_copy_gbps": nbytes / puts["zero-copy"] / 1e9,
            "get_staged_gbps": nbytes / gets["staged"] / 1e9,
            "get_zero_copy_gbps": nbytes / gets["zero-copy"] / 1e9,
        }
    finally:
        store.remove_all(True)
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=32, help="keys per batch (1 MiB each)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default="", help="write the results here too")
    args = ap.parse_args()
    per_call = args.keys * LAYERS * PART
    # room for the warm-up, the timed puts of both paths and the get keys
    room = (2 * (args.repeats + 1) + 2) * per_call // MiB + 64
    results = {}
    with pool(room * MiB) as master:
        results["node"] = measure(master, 0, args.keys, args.repeats)
    with pool(0) as master:
        results["lent"] = measure(master, room * MiB, args.keys, args.repeats)
    print(f"facade multi-buffer: {args.keys} keys x {LAYERS} x {PART // KiB} KiB per call "
          f"({per_call / MiB:.0f} MiB), median of {args.repeats}")  # fmt: skip
    head = f"{'placement':<10}{'op':<5}{'path':<11}{'GB/s':>8}{'x memcpy':>10}"
    print(head)
    for placement, r in results.items():
        base = r["memcpy_gbps"]
        print(f"{placement:<10}{'-':<5}{'memcpy':<11}{base:>8.2f}{1.0:>10.2f}")
        for op in ("put", "get"):
            for path in ("staged", "zero_copy"):
                v = r[f"{op}_{path}_gbps"]
                print(
                    f"{placement:<10}{op:<5}{path.replace('_', '-'):<11}{v:>8.2f}{v / base:>10.2f}"
                )
    if args.json:
        doc = {"keys": args.keys, "buffers_per_key": LAYERS, "buffer_bytes": PART,
               "repeats": args.repeats, "results": results}  # fmt: skip
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
