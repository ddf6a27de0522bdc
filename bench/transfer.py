"""Transfer-engine bench: GB/s of get (READ) and put (WRITE) across processes.

A server process exposes a /dev/shm segment (python -m kvstore.transfer.serve);
this process reads/writes objects of 64 KiB, 1 MiB and 16 MiB from/to it through
each transport, as one batch per repeat. Baselines measured in the same run:
memcpy (numpy copy of the same objects, one process) and a raw socket (plain
blocking sockets between two processes, same connection count, same sizes).
Targets: shm/nixl get >= 0.7x memcpy (objects >= 1 MiB); tcp >= 0.7x raw socket.

    python bench/transfer.py [--quick] [--json] [--connections 4]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from kvstore.transfer.base import SegmentDescriptor, TransferOp, TransferRequest, raise_first
from kvstore.transfer.nixl import nixl_available
from kvstore.transfer.select import make_engine
from kvstore.transfer.serve import read_descriptor
from kvstore.transfer.tcp import TcpConfig
from kvstore.transfer.wire import recv_into_exact, tune

KiB, MiB = 1 << 10, 1 << 20
SIZES = (64 * KiB, MiB, 16 * MiB)
TARGET = 0.7
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
class Ctx:
    """What a row-producing function gets: the served segment and the plan."""

    desc: SegmentDescriptor
    total: int
    repeats: int
    connections: int
    baselines: dict[tuple[str, int, str], float]  # (name, size, op) -> GB/s


def _median_gbps(total: int, repeats: int, run: Callable[[], None]) -> float:
    run()  # warm-up: page faults, connections, mappings
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return total / statistics.median(times) / 1e9


# -- baselines ------------------------------------------------------------------


def memcpy_gbps(size: int, total: int, repeats: int) -> float:
    src = np.ones(total, dtype=np.uint8)
    dst = np.ones(total, dtype=np.uint8)
    count = total // size

    def run() -> None:
        for i in range(count):
            dst[i * size : (i + 1) * size] = src[i * size : (i + 1) * size]

    return _median_gbps(total, repeats, run)


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


def raw_server(size: int, port_out: mp.connection.Connection) -> None:
    """Process body: serve raw GET/PUT requests (op, offset, length) over plain sockets."""
    mem = memoryview(np.ones(size, dtype=np.uint8)).cast("B")
    listener = socket.create_server(("127.0.0.1", 0))
    port_out.send(listener.getsockname()[1])
    while True:
        conn, _ = listener.accept()
        tune(conn)
        threading.Thread(target=_raw_serve_conn, args=(conn, mem), daemon=True).start()


def raw_socket_gbps(port: int, size: int, ctx: Ctx, op: int) -> float:
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(ctx.connections)]
    for sock in socks:
        tune(sock)
    local = memoryview(np.ones(ctx.total, dtype=np.uint8)).cast("B")
    count = ctx.total // size
    ack = memoryview(bytearray(1))

    def lane(t: int) -> None:
        sock = socks[t]
        for i in range(t, count, len(socks)):
            sock.sendall(RAW_REQ.pack(op, i * size, size))
            if op == 1:
                recv_into_exact(sock, local[i * size : (i + 1) * size])
            else:
                sock.sendall(local[i * size : (i + 1) * size])
                recv_into_exact(sock, ack)

    def run() -> None:
        threads = [threading.Thread(target=lane, args=(t,)) for t in range(len(socks))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    try:
        return _median_gbps(ctx.total, ctx.repeats, run)
    finally:
        for sock in socks:
            sock.close()


# -- transports ------------------------------------------------------------------


def engine_gbps(kind: str, size: int, ctx: Ctx, op: TransferOp) -> float:
    engine = make_engine(kind, tcp=TcpConfig(connections=ctx.connections))
    local = np.ones(ctx.total, dtype=np.uint8)
    buf = engine.register("bench", local)
    batch = [
        TransferRequest(op, ctx.desc, i * size, size, buf, i * size)
        for i in range(ctx.total // size)
    ]
    try:
        return _median_gbps(
            ctx.total, ctx.repeats, lambda: raise_first(engine.submit(batch).wait(120))
        )
    finally:
        engine.close()


def transport_rows(ctx: Ctx, kinds: list[str]) -> list[Row]:
    rows = []
    for size in SIZES:
        for kind in kinds:
            for op, name in ((TransferOp.READ, "get"), (TransferOp.WRITE, "put")):
                base = "memcpy" if kind in ("shm", "nixl") else "raw socket"
                rows.append(
                    Row(
                        size,
                        kind,
                        name,
                        engine_gbps(kind, size, ctx, op),
                        base,
                        ctx.baselines[(base, size, name)],
                    )
                )
    return rows


def extra_rows(ctx: Ctx) -> list[Row]:
    """LEAD: add the kvstore-client and Mooncake-store rows here (same Ctx, same sizes,
    baseline "memcpy" or "raw socket" from ctx.baselines)."""
    return []


# -- driver ----------------------------------------------------------------------


def measure_baselines(ctx_args: dict[str, int], port: int) -> dict[tuple[str, int, str], float]:
    base: dict[tuple[str, int, str], float] = {}
    ctx = Ctx(None, baselines={}, **ctx_args)  # type: ignore[arg-type]
    for size in SIZES:
        copy = memcpy_gbps(size, ctx.total, ctx.repeats)
        base[("memcpy", size, "get")] = base[("memcpy", size, "put")] = copy
        base[("raw socket", size, "get")] = raw_socket_gbps(port, size, ctx, 1)
        base[("raw socket", size, "put")] = raw_socket_gbps(port, size, ctx, 2)
    return base


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
        f"{'size':>8} {'transport':<10} {'op':<4} {'GB/s':>7} {'baseline':<11} "
        f"{'GB/s':>7} {'ratio':>6}  target"
    )
    for r in rows:
        ok = "ok" if r.ratio >= TARGET else "MISS"
        if r.transport in ("shm", "nixl") and r.size < MiB:
            ok = "-"  # the target covers objects >= 1 MiB only
        print(
            f"{r.size // KiB:>6}Ki {r.transport:<10} {r.op:<4} {r.gbps:>7.2f} "
            f"{r.baseline:<11} {r.baseline_gbps:>7.2f} {r.ratio:>6.2f}  {ok}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="transfer engine bench")
    parser.add_argument("--quick", action="store_true", help="64 MiB per op, 3 repeats")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--connections", type=int, default=4)
    args = parser.parse_args(argv)
    ctx_args = {
        "total": (64 if args.quick else 256) * MiB,
        "repeats": 3 if args.quick else 7,
        "connections": args.connections,
    }
    kinds = ["shm", "tcp"] + (["nixl"] if nixl_available() else [])
    spawn = mp.get_context("spawn")
    port_rx, port_tx = spawn.Pipe(duplex=False)
    raw = spawn.Process(target=raw_server, args=(ctx_args["total"], port_tx), daemon=True)
    raw.start()
    proc, desc = start_server(ctx_args["total"], "nixl" in kinds)
    try:
        baselines = measure_baselines(ctx_args, port_rx.recv())
        ctx = Ctx(desc, baselines=baselines, **ctx_args)
        rows = transport_rows(ctx, kinds) + extra_rows(ctx)
    finally:
        raw.terminate()
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
    if args.json:
        out = [asdict(r) | {"ratio": round(r.ratio, 3)} for r in rows]
        print(json.dumps({"bench": "transfer", **ctx_args, "target": TARGET, "rows": out}))
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
