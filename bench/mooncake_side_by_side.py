"""Mooncake's own store benchmark, run against Mooncake Store and kvstore side by side.

`store_kv_bench.py` (mooncake-store/benchmarks in the Mooncake repository, Apache-2.0;
vendored unchanged in bench/third_party/mooncake/) imports its store from
$MOONCAKE_STORE_MODULE. This
script runs it once per store and object size, with the same arguments:
`read_perf` with the zero-copy API (put_from / get_into from a registered buffer):
a write phase of N fresh objects, then a read phase of them. Stores:

    mooncake        mooncake.store + mooncake_master, protocol tcp (when installed)
    kvstore         kvstore.compat.mooncake + `kvstore master`, transport auto (shm here)
    kvstore-tcp     the same with KVSTORE_TRANSPORT=tcp
    kvstore-nopoll  (--no-poll-row) kvstore with busy polling off in the client and the
                    master (KVSTORE_BUSY_POLL_US=0, busy_poll_us=0; kvstore.busypoll)

`--placement own` (the harness default): the benchmark client lends the only
segment; `remote`: another process lends it (a `kvstore node`, or a Mooncake
client holding a segment) and the benchmark client lends none. Every Mooncake
process binds 127.0.0.1 (MC_TCP_BIND_ADDRESS). Ratios are kvstore / mooncake.

    python bench/mooncake_side_by_side.py [--placement own|remote] [--repeat 5] [--quick] [--json]
                                          [--in-call] [--no-poll-row]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "bench" / "third_party" / "mooncake" / "store_kv_bench.py"
MiB = 1 << 20
START_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Run:
    """One harness run. The harness's mean request latency, and (with --in-call) the
    mean time inside the store's own put_from / get_into (bench/store_timer.py), in
    microseconds."""

    write_mib_s: float
    read_mib_s: float
    ok: bool
    write_op_us: float = 0.0
    read_op_us: float = 0.0
    write_call_us: float = 0.0
    read_call_us: float = 0.0


@dataclass(frozen=True, slots=True)
class Row:
    store: str
    size: int
    objects: int
    run: Run  # the median of each figure over the row's runs

    def flat(self) -> dict[str, object]:
        return {"store": self.store, "size": self.size, "objects": self.objects,
                **asdict(self.run)}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env(**extra: str) -> dict[str, str]:
    out = dict(os.environ, PYTHONPATH=str(REPO), MC_TCP_BIND_ADDRESS="127.0.0.1")
    out.update(extra)
    return out


def wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)  # polling another process's listener
    raise RuntimeError(f"nothing listens on {port} after {START_TIMEOUT_S} s")


def wait_line(proc: subprocess.Popen[bytes], prefix: bytes) -> None:
    """Block until `proc` prints a line starting with `prefix` (it prints nothing else first)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return
    raise RuntimeError(f"process exited ({proc.wait()}) before printing {prefix!r}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def mooncake_pool(segment: int, remote: bool, log: Path) -> Iterator[str]:
    """mooncake_master on 127.0.0.1 (and a segment-holding client when `remote`)."""
    port = free_port()
    cmd = [
        shutil.which("mooncake_master") or "mooncake_master", "-rpc_address=127.0.0.1",
        f"-rpc_port={port}", "-metrics_host=127.0.0.1", f"-metrics_port={free_port()}",
    ]  # fmt: skip
    with open(log, "ab") as out:
        master = subprocess.Popen(cmd, stdout=out, stderr=out, env=env())
    procs = [master]
    try:
        wait_port(port, master)
        if remote:
            code = (
                "import sys\nfrom mooncake.store import MooncakeDistributedStore as S\n"
                f"s = S(); rc = s.setup('127.0.0.1', 'P2PHANDSHAKE', {segment}, {16 * MiB}, "
                f"'tcp', '', '127.0.0.1:{port}')\n"
                "print('holder', rc, flush=True); sys.stdin.read(); s.close()\n"
            )
            holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      env=env())  # fmt: skip
            procs.append(holder)
            wait_line(holder, b"holder 0")
        yield f"127.0.0.1:{port}"
    finally:
        for proc in reversed(procs):
            stop(proc)


@contextlib.contextmanager
def kvstore_pool(
    segment: int, remote: bool, log: Path, master_args: tuple[str, ...] = ()
) -> Iterator[str]:
    """`kvstore master` (and a `kvstore node` lending `segment` bytes when `remote`)."""
    kv = [sys.executable, "-m", "cli.main"]
    master_cmd = [*kv, "master", "--listen", "127.0.0.1:0", *master_args]
    master = subprocess.Popen(
        master_cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env()
    )
    procs = [master]
    try:
        assert master.stdout is not None
        address = master.stdout.readline().split()[4].decode()
        if remote:
            node_cmd = [*kv, "node", "--master", address, "--dram-mib", str(segment / MiB)]
            with open(log, "ab") as out:
                node = subprocess.Popen(node_cmd, stdout=subprocess.PIPE, stderr=out, env=env())
            procs.append(node)
            wait_line(node, b"kvstore node ")
        yield address
    finally:
        for proc in reversed(procs):
            stop(proc)


def run_harness(
    harness: Path, module: str, master: str, size: int, objects: int, own_segment: int,
    extra_env: dict[str, str], workdir: Path, in_call: bool = False,
) -> Run:  # fmt: skip
    """One read_perf run, from its summary JSON (and with `in_call`, the time spent
    inside the store's calls: bench/store_timer.py)."""
    tag = uuid.uuid4().hex[:8]
    summary = workdir / f"summary-{tag}.json"
    times = workdir / f"times-{tag}.json"
    if in_call:
        extra_env = dict(extra_env, KVS_TIMED_STORE_MODULE=module, KVS_STORE_TIMES=str(times))
        module = "store_timer"
    args = [
        sys.executable, str(harness), "--scenario", "read_perf", "--io-api", "zcopy",
        "--master-server", master, "--metadata-server", "P2PHANDSHAKE",
        "--local-hostname", "127.0.0.1", "--protocol", "tcp",
        "--global-segment-size", str(own_segment), "--local-buffer-size", str(size + MiB),
        "--value-size", str(size), "--nr-objects", str(objects),
        "--key-prefix", f"sbs{uuid.uuid4().hex[:6]}", "--key-size", "32",
        "--summary-json", str(summary), "--log-level", "WARNING",
    ]  # fmt: skip
    run_env = env(MOONCAKE_STORE_MODULE=module, **extra_env)
    if in_call:
        run_env["PYTHONPATH"] = f"{REPO / 'bench'}{os.pathsep}{run_env['PYTHONPATH']}"
    with open(workdir / "harness.log", "ab") as log:
        subprocess.run(args, stdout=log, stderr=log, env=run_env, timeout=600, check=False)
    if not summary.exists():
        return Run(0.0, 0.0, False)
    phases = json.loads(summary.read_text())
    p = phases["phases"]
    w, r = p["prepare_write"], p["read_perf"]
    ok = bool(phases["ok"]) and r["successful_kvs"] >= objects  # crashed lane: 0
    call = json.loads(times.read_text()) if times.exists() else {}

    def mean_us(kind: str) -> float:
        n, secs = call.get(kind, (0, 0.0))
        return secs / n * 1e6 if n else 0.0

    return Run(
        w["MiB_per_sec"], r["MiB_per_sec"], ok, w["lat_mean_ms"] * 1e3, r["lat_mean_ms"] * 1e3,
        mean_us("put"), mean_us("get"),
    )  # fmt: skip


Store = tuple[str, str, dict[str, str], tuple[str, ...]]


def stores(no_poll_row: bool = False) -> list[Store]:
    """(label, store module, extra env, extra `kvstore master` flags) of every store
    that can run here."""
    out: list[Store] = []
    with contextlib.suppress(ImportError):
        import mooncake.store  # noqa: F401

        if shutil.which("mooncake_master"):
            out.append(("mooncake", "mooncake.store", {}, ()))
    kv = "kvstore.compat.mooncake"
    out.append(("kvstore", kv, {"KVSTORE_TRANSPORT": "auto"}, ()))
    out.append(("kvstore-tcp", kv, {"KVSTORE_TRANSPORT": "tcp"}, ()))
    if no_poll_row:
        off = {"KVSTORE_TRANSPORT": "auto", "KVSTORE_BUSY_POLL_US": "0"}
        out.append(("kvstore-nopoll", kv, off, ("--set", "busy_poll_us=0")))
    return out


def bench(
    harness: Path, sizes: list[int], objects: int, remote: bool, workdir: Path, repeat: int = 1,
    in_call: bool = False, no_poll_row: bool = False,
) -> list[Row]:  # fmt: skip
    """Each (store, size) `repeat` times, the stores interleaved within each round (drift
    hits all alike); per row the median of each figure over its runs."""
    runs: dict[tuple[str, int], list[Run]] = {}
    for _ in range(repeat):
        for size in sizes:
            for label, module, extra, flags in stores(no_poll_row):
                segment = size * objects * 5 // 4 + 64 * MiB  # stay clear of 95% eviction
                log = workdir / f"{label}.log"
                pool = (
                    mooncake_pool(segment, remote, log) if label == "mooncake"
                    else kvstore_pool(segment, remote, log, flags)
                )  # fmt: skip
                with pool as master:
                    own = 0 if remote else segment
                    runs.setdefault((label, size), []).append(run_harness(
                        harness, module, master, size, objects, own, extra, workdir, in_call
                    ))  # fmt: skip
    rows = []
    for label, *_ in stores(no_poll_row):
        for size in sizes:
            got = runs[(label, size)]
            figures = {f.name: statistics.median(getattr(x, f.name) for x in got)
                       for f in fields(Run) if f.name != "ok"}  # fmt: skip
            rows.append(Row(label, size, objects, Run(ok=all(x.ok for x in got), **figures)))
    return rows


def ceiling(op_us: float, call_us: float) -> float:
    """How many times faster than a store whose call takes `call_us` of a harness
    operation of `op_us` another store can be, were its own call free (0: unknown)."""
    rest = op_us - call_us
    return op_us / rest if call_us > 0 and rest > 0 else 0.0


def print_table(rows: list[Row], placement: str) -> None:
    base = {(r.size, "w"): r.run.write_mib_s for r in rows if r.store == "mooncake"}
    base |= {(r.size, "r"): r.run.read_mib_s for r in rows if r.store == "mooncake"}
    print(f"store_kv_bench read_perf, zero-copy API, segment placement: {placement}")
    print(f"{'size':>7} {'store':<12} {'write MiB/s':>12} {'x mc':>6} {'read MiB/s':>11} "
          f"{'x mc':>6}  ok")  # fmt: skip
    for row in rows:
        r = row.run
        wx = r.write_mib_s / base[(row.size, "w")] if base.get((row.size, "w")) else 0.0
        rx = r.read_mib_s / base[(row.size, "r")] if base.get((row.size, "r")) else 0.0
        print(f"{row.size // MiB:>5}Mi {row.store:<12} {r.write_mib_s:>12.0f} {wx:>6.2f} "
              f"{r.read_mib_s:>11.0f} {rx:>6.2f}  {r.ok}")  # fmt: skip
    if not any(row.run.write_call_us for row in rows):
        return
    print("\nper operation, us: the harness's request (mean) / inside the store's call;")
    print("ceiling: the most any store can be ahead of this one were its own call free")
    for row in rows:
        r = row.run
        print(f"{row.size // MiB:>5}Mi {row.store:<12} write {r.write_op_us:>8.0f} / "
              f"{r.write_call_us:>8.0f} (ceiling {ceiling(r.write_op_us, r.write_call_us):.2f}x)"
              f"   read {r.read_op_us:>8.0f} / {r.read_call_us:>8.0f} "
              f"(ceiling {ceiling(r.read_op_us, r.read_call_us):.2f}x)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", type=Path, default=HARNESS, help="path of store_kv_bench.py")
    parser.add_argument("--placement", choices=["own", "remote"], default="own")
    parser.add_argument("--objects", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="16 objects per size")
    parser.add_argument("--repeat", type=int, default=1, help="runs per row (median)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--in-call", action="store_true",
                        help="also time the store's own calls (bench/store_timer.py)")  # fmt: skip
    parser.add_argument("--no-poll-row", action="store_true",
                        help="also run kvstore with busy polling off")  # fmt: skip
    args = parser.parse_args(argv)
    if not args.harness.is_file():
        parser.error(f"no harness at {args.harness}")
    objects = 16 if args.quick else args.objects
    with tempfile.TemporaryDirectory(prefix="kvs-sbs-") as tmp:
        remote = args.placement == "remote"
        rows = bench(args.harness, [MiB, 16 * MiB], objects, remote, Path(tmp), args.repeat,
                     args.in_call, args.no_poll_row)  # fmt: skip
    if args.json:
        doc = {"bench": "mooncake_side_by_side", "placement": args.placement,
               "repeat": args.repeat, "rows": [r.flat() for r in rows]}  # fmt: skip
        print(json.dumps(doc))
    else:
        print_table(rows, args.placement)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
