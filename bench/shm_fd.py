"""Same-host pooled get over shared memory mapped by fd (memfd + SCM_RIGHTS) vs memcpy.

A `kvstore master` and one `kvstore node` (DRAM only, no NIXL agent: nothing else
spins while we measure) run as other processes; this process is a pure client
(`kvstore.Client(transport="shm")`): it puts objects of 1 MiB and 16 MiB, then
times `batch_get_into` of all of them into a registered buffer, which maps the
node's segment once (its fd fetched from the node's abstract socket) and copies
out of it. Baseline, same run, interleaved with the gets: memcpy of the same
objects between two arrays of this process (as bench/transfer.py). Target: get
>= 0.7x memcpy. Also shown: what mapping by fd costs once per segment (fd round
trip alone, and fd + mmap with MAP_POPULATE of the whole segment), and the data
path alone, without client or master: copies out of a memfd mapping vs a /dev/shm
file mapping (the first design) vs memcpy, interleaved in one process.

    python bench/shm_fd.py [--quick] [--json] [--total-mib 64] [--repeats 7]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
SIZES = (MiB, 16 * MiB)
TARGET = 0.7


def _spawn(cmd: list[str], procs: list[subprocess.Popen[bytes]], ready: bytes) -> bytes:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    procs.append(proc)
    assert proc.stdout is not None
    for line in proc.stdout:  # bounded by the process: EOF when it exits
        if line.startswith(ready):
            return line
    raise RuntimeError(f"{cmd!r} exited ({proc.wait()}) before printing {ready!r}")


@contextlib.contextmanager
def pool(dram_bytes: int) -> Iterator[str]:
    """A master + one DRAM node (none when `dram_bytes` is 0) on 127.0.0.1; yields the
    master address (bench/facade_multibuf.py uses it too)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        py = [sys.executable, "-m"]
        line = _spawn([*py, "kvstore.master", "--listen", "127.0.0.1:0"], procs, b"kvstore master")
        master = line.split()[4].decode()
        if dram_bytes:
            node = [*py, "kvstore.node", "--master", master, "--dram-mib", str(dram_bytes / MiB)]
            _spawn(node, procs, b"kvstore node ")  # no --nixl: its agent would spin a core
        yield master
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def timed(runs: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median seconds per runner; one warm-up each, then repeats interleaved."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def memcpy(total: int, size: int) -> Callable[[], None]:
    src = np.ones(total, dtype=np.uint8)
    dst = np.ones(total, dtype=np.uint8)

    def run() -> None:
        for i in range(0, total, size):
            dst[i : i + size] = src[i : i + size]

    return run


def put_objects(client: object, total: int, size: int) -> tuple[list[str], np.ndarray]:
    keys = [f"shmfd-{size}-{i}" for i in range(total // size)]
    src = np.random.default_rng(size).integers(0, 256, total, dtype=np.uint8)
    items = [(k, src[i * size : (i + 1) * size]) for i, k in enumerate(keys)]
    errors = client.batch_put(items)  # type: ignore[attr-defined]
    if any(e is not None for e in errors):
        raise RuntimeError(f"put failed: {next(e for e in errors if e is not None)!r}")
    return keys, src


def pooled_get(client: object, keys: list[str], src: np.ndarray, size: int) -> Callable[[], None]:
    """One batch_get_into of every key into a registered buffer (checked once)."""
    local = np.ones(src.nbytes, dtype=np.uint8)
    client.register_buffer(local)  # type: ignore[attr-defined]
    views = [memoryview(local)[i : i + size] for i in range(0, src.nbytes, size)]

    def run() -> None:
        got = client.batch_get_into(keys, views)  # type: ignore[attr-defined]
        if any(n != size for n in got):
            raise RuntimeError(f"failed get: {got}")

    run()
    if not np.array_equal(local, src):
        raise RuntimeError("pooled get returned other bytes")
    return run


def attach_cost(master: str, repeats: int) -> dict[str, float]:
    """Milliseconds to fetch the node segment's fd, and fd + mmap(MAP_POPULATE)."""
    import grpc

    from kvstore.v1 import master_pb2, master_pb2_grpc

    with grpc.insecure_channel(master) as channel:
        stats = master_pb2_grpc.MasterStub(channel).Stats(master_pb2.StatsRequest(), timeout=30)
    nodes = {n.node_id: n.endpoint for n in stats.nodes}
    seg = next(s for s in stats.segments if s.shm)
    address = getattr(nodes[seg.node_id], "shm_socket", "")
    if not address:
        return {}  # a build before map-by-fd
    from kvstore.tiers.shm import SharedSegment, fetch_fd

    def fd_only() -> None:
        os.close(fetch_fd(address, seg.segment))

    def fd_and_map() -> None:
        SharedSegment.attach(seg.segment, address, writable=True, populate=True).close()

    med = timed({"fd": fd_only, "map": fd_and_map}, repeats)
    return {
        "fd_roundtrip_ms": med["fd"] * 1e3,
        "fd_map_populate_ms": med["map"] * 1e3,
        "segment_mib": seg.capacity / MiB,
    }


def mapping_kinds(total: int, size: int, repeats: int) -> dict[str, float]:
    """GB/s of copying `total` bytes in `size` chunks out of a peer mapping of a memfd
    (fd received over the socket) vs one of a /dev/shm file (the old design; unlinked
    as soon as it is mapped, so even a crash leaves no file), vs memcpy: the data path
    alone, same process, interleaved. Before the first run both are written once."""
    import mmap

    from kvstore.tiers.shm import FdServer, SharedSegment

    server = FdServer()
    server.start()
    owner = SharedSegment.create(f"shmfd-bench-{os.getpid()}", total)
    owner.numpy()[:] = 1
    owner.serve(server)
    peer = SharedSegment.attach(owner.name, server.address, populate=True)
    path = f"/dev/shm/shmfd-bench-{os.getpid()}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.unlink(path)
        os.ftruncate(fd, total)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        file_map = mmap.mmap(fd, total, flags, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    np.frombuffer(file_map, dtype=np.uint8)[:] = 1
    dst = np.ones(total, dtype=np.uint8)

    def copier(src: np.ndarray) -> Callable[[], None]:
        def run() -> None:
            for i in range(0, total, size):
                dst[i : i + size] = src[i : i + size]

        return run

    runs = {
        "memfd": copier(peer.numpy()),
        "dev_shm_file": copier(np.frombuffer(file_map, dtype=np.uint8)),
        "memcpy": memcpy(total, size),
    }
    med = timed(runs, repeats)
    runs.clear()
    peer.close()
    owner.close()
    server.stop()
    with contextlib.suppress(BufferError):
        file_map.close()
    return {name: total / t / 1e9 for name, t in med.items()}


def measure(total: int, repeats: int) -> dict[str, object]:
    from kvstore.client.client import Client
    from kvstore.client.config import ClientConfig

    # Builds with per-read checksums (ClientConfig.verify_dram) also get a row without them.
    variants = {"get": {}}
    if "verify_dram" in {f.name for f in dataclasses.fields(ClientConfig)}:
        variants["get, verify_dram off"] = {"verify_dram": False}
    rows = []
    with pool(2 * total + 16 * MiB) as master, contextlib.ExitStack() as stack:
        clients = {
            name: stack.enter_context(Client(master, transport="shm", timeout_s=60.0, **opts))
            for name, opts in variants.items()
        }
        for size in SIZES:
            keys, src = put_objects(clients["get"], total, size)
            runs = {"memcpy": memcpy(total, size)}
            runs.update({n: pooled_get(c, keys, src, size) for n, c in clients.items()})
            med = timed(runs, repeats)
            gbps = {name: total / t / 1e9 for name, t in med.items()}
            for name in clients:
                rows.append({
                    "size": size, "op": name, "gbps": gbps[name], "memcpy_gbps": gbps["memcpy"],
                    "ratio": gbps[name] / gbps["memcpy"],
                })  # fmt: skip
        attach = attach_cost(master, repeats)
    kinds = {size: mapping_kinds(total, size, repeats) for size in SIZES}
    return {
        "total_bytes": total, "repeats": repeats, "rows": rows, "attach": attach,
        "mapping_kinds": kinds,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 MiB per run, 3 repeats")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--total-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    total = (32 if args.quick else args.total_mib) * MiB
    result = measure(total, 3 if args.quick else args.repeats)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"same-host pooled get over shm (map by fd), {total // MiB} MiB per run, median of "
          f"{result['repeats']}")  # fmt: skip
    print(f"{'size':>8} {'op':<22} {'GB/s':>6} {'memcpy GB/s':>12} {'ratio':>6}  target {TARGET}x")
    for r in result["rows"]:  # type: ignore[attr-defined]
        ok = "ok" if r["ratio"] >= TARGET else "BELOW"
        print(f"{r['size'] // MiB:>5} MiB {r['op']:<22} {r['gbps']:>6.2f} "
              f"{r['memcpy_gbps']:>12.2f} {r['ratio']:>5.2f}x  {ok}")  # fmt: skip
    print("data path alone (one process): copy out of a peer mapping, GB/s")
    for size, k in result["mapping_kinds"].items():  # type: ignore[attr-defined]
        memfd, file, copy = k["memfd"], k["dev_shm_file"], k["memcpy"]
        print(f"{size // MiB:>5} MiB memfd {memfd:.2f}  /dev/shm file {file:.2f}  "
              f"memcpy {copy:.2f}  memfd/file {memfd / file:.2f}x")  # fmt: skip
    attach = result["attach"]
    if attach:
        print(f"once per segment ({attach['segment_mib']:.0f} MiB): fd round trip "
              f"{attach['fd_roundtrip_ms']:.3f} ms, fd + mmap(MAP_POPULATE) "
              f"{attach['fd_map_populate_ms']:.2f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
