"""Transfer-engine bench: GB/s of get (READ) and put (WRITE) across processes.

A server process exposes a shared-memory segment (python -m kvstore.transfer.serve);
this process reads/writes objects of 64 KiB, 1 MiB and 16 MiB from/to it through
each transport, as one batch per repeat. Baselines measured in the same run:
memcpy (numpy copy of the same objects, one process) and a raw socket (plain
blocking sockets between two processes, same connection count, same sizes), each
twice: first alone, before any engine or store process exists ("memcpy-quiet",
"raw socket-quiet"), then beside the rows they judge. Every transport and store row
is shown against both; the run goes in phases so that no NIXL agent (which spins a
core while alive) idles beside another row: shm + tcp against a plain server, NIXL
against a NIXL server, then the store rows: kv-shm, kv-tcp and Mooncake against a
node without a NIXL agent, kv-nixl against one that serves NIXL.
Targets: shm/nixl get >= 0.7x memcpy (objects >= 1 MiB); tcp >= 0.7x raw socket.

Store rows (bench/transfer_stores.py; skip with --no-stores): a kvstore client per
transport (kv-shm, kv-tcp, kv-nixl when installed) against a `kvstore master` +
`kvstore node` in other processes, and Mooncake Store (its mooncake_master on 127.0.0.1 and a client
process holding the segment) when `mooncake` imports. Each kv row is also shown
against the Mooncake row of the same size and op: target >= 3x.

    python bench/transfer.py [--quick] [--json] [--connections 4] [--no-stores]
    python -m bench.transfer --quick --json     # stdout: exactly one JSON object

With --json, everything else written to stdout while measuring (NIXL's and
Mooncake's logs, from C as well as Python, and from child processes) goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Connection

import numpy as np

try:  # python -m bench.transfer
    from bench.transfer_stores import (
        Pools,
        kvstore_runners,
        mooncake_available,
        mooncake_runners,
        start_pools,
    )
except ImportError:  # python bench/transfer.py (bench/ is on sys.path)
    from transfer_stores import (  # type: ignore[no-redef]
        Pools,
        kvstore_runners,
        mooncake_available,
        mooncake_runners,
        start_pools,
    )

from kvstore.transfer.base import SegmentDescriptor, TransferOp, TransferRequest, raise_first
from kvstore.transfer.nixl import nixl_available
from kvstore.transfer.select import make_engine
from kvstore.transfer.serve import read_descriptor
from kvstore.transfer.tcp import TcpConfig
from kvstore.transfer.wire import recv_into_exact, tune

KiB, MiB = 1 << 10, 1 << 20
SIZES = (64 * KiB, MiB, 16 * MiB)
TARGET = 0.7
MOONCAKE_TARGET = 3.0
RAW_REQ = struct.Struct("<BQQ")  # op, offset, length


@dataclass(frozen=True, slots=True)
class Row:
    size: int
    transport: str
    op: str  # "get" | "put"
    gbps: float
    baseline: str
    baseline_gbps: float

    @property
    def ratio(self) -> float:
        return self.gbps / self.baseline_gbps if self.baseline_gbps else 0.0


@dataclass(frozen=True, slots=True)
class Runner:
    """One measured thing: `run()` moves `total` bytes once; `close()` frees it."""

    transport: str
    op: str
    baseline: str  # the transport this row is compared with ("" for a baseline)
    run: Callable[[], None]
    close: Callable[[], None] = lambda: None
    prepare: Callable[[], None] = lambda: None  # untimed, before every run (fresh keys)


@dataclass(frozen=True, slots=True)
class Ctx:
    """The plan and the served segment, given to every runner factory."""

    desc: SegmentDescriptor | None  # None for the baseline-only phase
    total: int  # bytes moved per run (total // size objects)
    repeats: int
    connections: int
    raw_port: int
    pools: Pools | None = None  # kvstore (and Mooncake) pools for the store rows


# -- baselines ------------------------------------------------------------------


def memcpy_runner(ctx: Ctx, size: int) -> Runner:
    src = np.ones(ctx.total, dtype=np.uint8)
    dst = np.ones(ctx.total, dtype=np.uint8)

    def run() -> None:
        for i in range(0, ctx.total, size):
            dst[i : i + size] = src[i : i + size]

    return Runner("memcpy", "copy", "", run)


def _raw_serve_conn(conn: socket.socket, mem: memoryview) -> None:
    header = memoryview(bytearray(RAW_REQ.size))
    try:
        while True:
            recv_into_exact(conn, header)
            op, offset, length = RAW_REQ.unpack(header)
            if op == 1:
                conn.sendall(mem[offset : offset + length])
            else:
                recv_into_exact(conn, mem[offset : offset + length])
                conn.sendall(b"k")
    except (ConnectionError, OSError):
        conn.close()


def raw_server(size: int, port_out: Connection) -> None:
    """Process body: serve raw GET/PUT requests (op, offset, length) over plain sockets."""
    mem = memoryview(np.ones(size, dtype=np.uint8)).cast("B")
    listener = socket.create_server(("127.0.0.1", 0))
    port_out.send(listener.getsockname()[1])
    while True:
        conn, _ = listener.accept()
        tune(conn)
        threading.Thread(target=_raw_serve_conn, args=(conn, mem), daemon=True).start()


def raw_runner(ctx: Ctx, size: int, op: int) -> Runner:
    """Plain blocking sockets, `connections` threads, one request per object."""
    socks = [socket.create_connection(("127.0.0.1", ctx.raw_port)) for _ in range(ctx.connections)]
    for sock in socks:
        tune(sock)
    local = memoryview(np.ones(ctx.total, dtype=np.uint8)).cast("B")
    ack = memoryview(bytearray(1))

    def lane(sock: socket.socket, first: int) -> None:
        for i in range(first * size, ctx.total, size * len(socks)):
            sock.sendall(RAW_REQ.pack(op, i, size))
            if op == 1:
                recv_into_exact(sock, local[i : i + size])
            else:
                sock.sendall(local[i : i + size])
                recv_into_exact(sock, ack)

    def run() -> None:
        threads = [threading.Thread(target=lane, args=(s, t)) for t, s in enumerate(socks)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def close() -> None:
        for sock in socks:
            sock.close()

    return Runner("raw socket", "get" if op == 1 else "put", "", run, close)


# -- transports ------------------------------------------------------------------


def engine_runner(ctx: Ctx, size: int, kind: str, op: TransferOp) -> Runner:
    """Our engine: all objects of one run as one batch."""
    engine = make_engine(kind, tcp=TcpConfig(connections=ctx.connections))
    local = np.ones(ctx.total, dtype=np.uint8)
    buf = engine.register("bench", local)
    assert ctx.desc is not None
    batch = [TransferRequest(op, ctx.desc, i, size, buf, i) for i in range(0, ctx.total, size)]
    baseline = "memcpy" if kind in ("shm", "nixl") else "raw socket"
    name = "get" if op == TransferOp.READ else "put"
    return Runner(
        kind, name, baseline, lambda: raise_first(engine.submit(batch).wait(120)), engine.close
    )


def plain_runners(ctx: Ctx, size: int) -> list[Runner]:
    """The shm and tcp engines, beside the baselines they are judged by."""
    runners = [memcpy_runner(ctx, size), raw_runner(ctx, size, 1), raw_runner(ctx, size, 2)]
    return runners + [engine_runner(ctx, size, k, op) for k in ("shm", "tcp") for op in TransferOp]


def nixl_runners(ctx: Ctx, size: int) -> list[Runner]:
    return [memcpy_runner(ctx, size)] + [engine_runner(ctx, size, "nixl", op) for op in TransferOp]


def kv_transports() -> list[str]:
    """Transports of the kvstore-client rows (nodes serve DRAM by NIXL when installed)."""
    return ["shm", "tcp"] + (["nixl"] if nixl_available() else [])


def extra_runners(ctx: Ctx, size: int, transports: list[str] | None = None) -> list[Runner]:
    """kvstore-client runners per transport and Mooncake-store runners (timed interleaved)."""
    if ctx.pools is None:
        return []
    made = []
    for transport in kv_transports() if transports is None else transports:
        made += kvstore_runners(ctx.pools, ctx.total, size, transport)
    if ctx.pools.mc_store is not None:
        made += mooncake_runners(ctx.pools, ctx.total, size)
    return [Runner(r.transport, r.op, r.baseline, r.run, r.close, r.prepare) for r in made]


def versus_mooncake(rows: list[Row]) -> list[Row]:
    """Every kvstore-client row again, with the Mooncake row of its size and op as baseline."""
    mc = {(r.size, r.op): r.gbps for r in rows if r.transport == "mooncake"}
    return [
        Row(r.size, r.transport, r.op, r.gbps, "mooncake", mc[(r.size, r.op)])
        for r in rows
        if r.transport.startswith("kv-") and r.baseline != "mooncake" and (r.size, r.op) in mc
    ]


# -- driver ----------------------------------------------------------------------


def measure(ctx: Ctx, size: int, runners: list[Runner]) -> list[Row]:
    """Time every runner `repeats` times, interleaved (drift hits all alike); medians."""
    times: dict[int, list[float]] = {i: [] for i in range(len(runners))}
    for runner in runners:
        runner.prepare()
        runner.run()  # warm-up: page faults, connections, mappings
    for _ in range(ctx.repeats):
        for i, runner in enumerate(runners):
            runner.prepare()
            start = time.perf_counter()
            runner.run()
            times[i].append(time.perf_counter() - start)
    gbps = {i: ctx.total / statistics.median(t) / 1e9 for i, t in times.items()}
    base = {(r.transport, r.op): gbps[i] for i, r in enumerate(runners) if not r.baseline}
    return [
        Row(
            size,
            r.transport,
            r.op,
            gbps[i],
            r.baseline,
            base.get((r.baseline, "copy" if r.baseline == "memcpy" else r.op), 0.0),
        )
        for i, r in enumerate(runners)
        if r.baseline
    ] + [
        Row(size, r.transport, r.op, gbps[i], "", 0.0)
        for i, r in enumerate(runners)
        if not r.baseline
    ]


def start_server(total: int, with_nixl: bool) -> tuple[subprocess.Popen[bytes], SegmentDescriptor]:
    name = f"kvt-bench-{uuid.uuid4().hex[:10]}"
    cmd = [sys.executable, "-m", "kvstore.transfer.serve", "--name", name, "--size", str(total)]
    proc = subprocess.Popen(
        cmd + (["--nixl"] if with_nixl else []), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    return proc, read_descriptor(proc.stdout)


def print_table(rows: list[Row]) -> None:
    print(
        f"{'size':>8} {'transport':<11} {'op':<4} {'GB/s':>7} {'baseline':<11} "
        f"{'GB/s':>7} {'ratio':>6}  target {TARGET}x ({MOONCAKE_TARGET}x vs mooncake)"
    )
    for r in rows:
        if not r.baseline:
            print(f"{r.size // KiB:>6}Ki {r.transport:<11} {r.op:<4} {r.gbps:>7.2f}  (baseline)")
            continue
        target = MOONCAKE_TARGET if r.baseline == "mooncake" else TARGET
        verdict = "ok" if r.ratio >= target else "MISS"
        if r.baseline.startswith("memcpy") and (r.size < MiB or r.op != "get"):
            verdict = "-"  # the target covers same-host get of objects >= 1 MiB
        print(
            f"{r.size // KiB:>6}Ki {r.transport:<11} {r.op:<4} {r.gbps:>7.2f} "
            f"{r.baseline:<11} {r.baseline_gbps:>7.2f} {r.ratio:>6.2f}  {verdict}"
        )


def run_phase(ctx: Ctx, make: Callable[[Ctx, int], list[Runner]]) -> list[Row]:
    """Every size, with the runners `make` builds, timed interleaved; closed after."""
    rows = []
    for size in SIZES:
        runners = make(ctx, size)
        try:
            rows += measure(ctx, size, runners)
        finally:
            for runner in runners:
                runner.close()
    return rows


def baseline_runners(ctx: Ctx, size: int) -> list[Runner]:
    return [memcpy_runner(ctx, size), raw_runner(ctx, size, 1), raw_runner(ctx, size, 2)]


QUIET = "-quiet"  # suffix of the baselines measured before any engine or store process ran


def versus_quiet(rows: list[Row], quiet: list[Row]) -> list[Row]:
    """Every row against a baseline again: the same baseline measured with nothing else
    running (no NIXL agent, no store process) instead of the one measured beside it."""
    base = {(r.size, r.transport, r.op): r.gbps for r in quiet}
    out = []
    for r in rows:
        op = "copy" if r.baseline == "memcpy" else r.op
        q = base.get((r.size, r.baseline + QUIET, op))
        if r.baseline in ("memcpy", "raw socket") and q:
            out.append(Row(r.size, r.transport, r.op, r.gbps, r.baseline + QUIET, q))
    return out


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point fd 1 at stderr for the block (C libraries and children inherit it)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="transfer engine bench")
    parser.add_argument("--quick", action="store_true", help="64 MiB per run, 3 repeats")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--no-stores", action="store_true", help="transports and baselines only")
    parser.add_argument("--out", default="bench/out/transfer",
                        help="writes OUT.json and OUT.png ('' = neither)")  # fmt: skip
    args = parser.parse_args(argv)
    quiet = stdout_to_stderr() if args.json else contextlib.nullcontext()
    with quiet:
        rows, plan = measure_all(args)
    out = [asdict(r) | {"ratio": round(r.ratio, 3)} for r in rows]
    targets = {"target": TARGET, "mooncake_target": MOONCAKE_TARGET}
    doc = {"bench": "transfer", **plan, **targets, "rows": out}
    if args.out:
        try:
            from bench.plots import plot_transfer, write_outputs
        except ImportError:  # python bench/transfer.py (bench/ is on sys.path)
            from plots import plot_transfer, write_outputs  # type: ignore[no-redef]

        png = write_outputs(doc, args.out, plot_transfer)
        print(f"wrote {args.out}.json and {png}", file=sys.stderr)
    if args.json:
        print(json.dumps(doc))
    else:
        print_table(rows)
    return 0


def measure_all(args: argparse.Namespace) -> tuple[list[Row], dict[str, int]]:
    """Start the servers and pools, measure every row, stop them; (rows, plan)."""
    total, repeats = (64 * MiB, 3) if args.quick else (256 * MiB, 7)
    spawn = mp.get_context("spawn")
    port_rx, port_tx = spawn.Pipe(duplex=False)
    raw = spawn.Process(target=raw_server, args=(total, port_tx), daemon=True)
    raw.start()
    base = Ctx(None, total, repeats, args.connections, port_rx.recv())
    try:
        # Phases, so that nothing idles beside what is measured (a NIXL agent spins a
        # core while alive): quiet baselines alone; shm + tcp against a plain server;
        # NIXL against a NIXL server; then the stores (their processes alive).
        quiet = run_phase(base, baseline_runners)
        rows = _with_server(base, False, plain_runners)
        if nixl_available():
            rows += _with_server(base, True, nixl_runners)
        if not args.no_stores:
            rows += _with_pools(base)
    finally:
        raw.terminate()
    quiet = [Row(r.size, r.transport + QUIET, r.op, r.gbps, "", 0.0) for r in quiet]
    rows = quiet + rows + versus_mooncake(rows) + versus_quiet(rows, quiet)
    return rows, {"total": total, "repeats": repeats, "connections": args.connections}


def _with_server(base: Ctx, nixl: bool, make: Callable[[Ctx, int], list[Runner]]) -> list[Row]:
    proc, desc = start_server(base.total, nixl)
    try:
        return run_phase(replace(base, desc=desc), make)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)


def _with_pools(base: Ctx) -> list[Row]:
    """The store rows: shm, tcp and Mooncake against a node without a NIXL agent, then
    (when installed) the kv-nixl rows against a node serving NIXL."""
    rows = _pools_phase(base, ["shm", "tcp"], mooncake_available(), False)
    if nixl_available():
        rows += _pools_phase(base, ["nixl"], False, True)
    return rows


def _pools_phase(base: Ctx, transports: list[str], mooncake: bool, nixl: bool) -> list[Row]:
    # kv: get + put objects per transport; Mooncake: get + put objects
    # 3x, not 2x: at 2x the data of 3 transports is 96% of the pool, past the
    # master's 95% high watermark, and eviction drops another row's get keys.
    kv_bytes = 3 * base.total * len(transports) + 64 * MiB
    pools = start_pools(kv_bytes, 2 * base.total + 64 * MiB, mooncake, nixl)
    try:
        ctx = replace(base, pools=pools)
        return run_phase(ctx, lambda c, s: baseline_runners(c, s) + extra_runners(c, s, transports))
    finally:
        pools.close()


if __name__ == "__main__":
    raise SystemExit(main())
