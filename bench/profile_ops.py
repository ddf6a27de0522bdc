"""Where one put and one get spend their time, by stage (issue 14, point 5).

A `kvstore master` and a `kvstore node` lending DRAM run in other processes; this
process is one client with a registered buffer (the zero-copy API, as Mooncake's
store_kv_bench uses it) doing N single-object `put_from` then N `get_into`. Every
master call and every data-path batch is timed where the client makes it, so each
operation's wall time splits into:

    rpc       master round trips over gRPC (the master's own work included), per method
    lane      master round trips over the fast lane (kvstore.fastlane), per method
    transfer  the data path's batches (shm copy / TCP / NIXL)
    local     copy + checksum done by the client itself on mapped memory
    other     the rest: Python in the client (building requests, bookkeeping)

`--cprofile N` also prints the top N functions by cumulative time of the get and
put loops. Each phase also reports CPU per operation: this client thread's
(`time.thread_time`) and the master process's (/proc, 10 ms ticks: use --ops >= 1000
for a figure to within a few percent); their sum against the wall time says how much
of an operation is Python on either side and how much is waiting (sockets, wake-ups).
Results: a table, and with --json one JSON object.

    python bench/profile_ops.py [--size-kib 1024] [--ops 200] [--transport auto|tcp]
                                [--tier dram|ssd] [--aligned]

`--tier ssd` puts into (and gets from) the node's SSD segment instead (an O_DIRECT
slab; a put's PutEnd waits for the node's PERSIST): the node's CPU is reported too.
`--aligned` gives the client page-aligned buffers (O_DIRECT needs them: others go
through a staging copy on the SSD tier).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvstore.client import reads  # noqa: E402
from kvstore.client.client import Client  # noqa: E402
from kvstore.client.datapath import DataPath  # noqa: E402
from kvstore.fastlane import SyncLane  # noqa: E402
from kvstore.types import Tier  # noqa: E402

MiB = 1 << 20


class Stages:
    """Seconds spent per stage, accumulated while `on`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def timed(self, stage: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.seconds[stage] += time.perf_counter() - t0
            self.calls[stage] += 1

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def instrument(client: Client, stages: Stages) -> None:
    """Wrap the client's master calls, its data path and its local copy to time them."""
    call = client.call_rpc
    client.call_rpc = lambda step: stages.timed(f"rpc:{step.method}", lambda: call(step))  # type: ignore[method-assign]
    run = DataPath.run
    DataPath.run = lambda self, op, ts, *a: stages.timed("transfer", lambda: run(self, op, ts, *a))  # type: ignore[method-assign]
    lane_call = SyncLane.call
    SyncLane.call = lambda self, m, r: stages.timed(f"lane:{m}", lambda: lane_call(self, m, r))  # type: ignore[method-assign]
    copy = reads._copy_hashed
    reads._copy_hashed = lambda d, s, loc, *a: stages.timed("local", lambda: copy(d, s, loc, *a))  # type: ignore[assignment]


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def pool(dram_mib: int, ssd_mib: int = 0) -> Iterator[tuple[str, int, int]]:
    """A master and (with `dram_mib`) a node; yields the master's address, its pid and
    the node's (0 = none)."""
    kv = [sys.executable, "-m", "cli.main"]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    quiet = {"stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL, "env": env}
    master = subprocess.Popen([*kv, "master", "--listen", "127.0.0.1:0"], **quiet)  # type: ignore[call-overload]
    procs = [master]
    ssd_dir = tempfile.mkdtemp(prefix="kvstore-profile-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    node_pid = 0
    try:
        assert master.stdout is not None
        address = master.stdout.readline().split()[4].decode()
        if dram_mib:
            node_cmd = [*kv, "node", "--master", address, "--dram-mib", str(dram_mib)]
            if ssd_mib:
                node_cmd += ["--ssd-dir", ssd_dir, "--ssd-mib", str(ssd_mib)]
            node = subprocess.Popen(node_cmd, **quiet)  # type: ignore[call-overload]
            procs.append(node)
            node_pid = node.pid
            assert node.stdout is not None
            for line in node.stdout:
                if line.startswith(b"kvstore node "):
                    break
        yield address, master.pid, node_pid
    finally:
        for p in reversed(procs):
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
            if p.poll() is None:
                p.kill()
                p.wait(5)
        shutil.rmtree(ssd_dir, ignore_errors=True)


def run_phase(
    name: str, ops: int, fn: Callable[[int], None], stages: Stages, profile: int,
    master_pid: int = 0, node_pid: int = 0,
) -> dict[str, Any]:  # fmt: skip
    stages.reset()
    lat = []
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    m0 = process_cpu_s(master_pid) if master_pid else 0.0
    n0 = process_cpu_s(node_pid) if node_pid else 0.0
    c0 = time.thread_time()
    t0 = time.perf_counter()
    for i in range(ops):
        s = time.perf_counter()
        fn(i)
        lat.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    client_cpu = time.thread_time() - c0
    master_cpu = process_cpu_s(master_pid) - m0 if master_pid else 0.0
    node_cpu = process_cpu_s(node_pid) - n0 if node_pid else 0.0
    if prof:
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(profile)
        print(f"--- cProfile: {name} ---\n{out.getvalue()}", file=sys.stderr)
    per_op = {k: v / ops * 1e6 for k, v in stages.seconds.items()}
    per_op["other"] = wall / ops * 1e6 - sum(per_op.values())
    lat.sort()
    return {
        "phase": name,
        "ops": ops,
        "us_per_op": wall / ops * 1e6,
        "p50_us": statistics.median(lat) * 1e6,
        "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6,
        "client_cpu_us": client_cpu / ops * 1e6,
        "master_cpu_us": master_cpu / ops * 1e6,
        "node_cpu_us": node_cpu / ops * 1e6,
        "stages_us": dict(sorted(per_op.items())),
        "calls_per_op": {k: v / ops for k, v in sorted(stages.calls.items())},
    }


def page_aligned(size: int) -> np.ndarray:
    """`size` bytes starting on a page boundary (numpy's own start 16 bytes past one)."""
    raw = np.empty(size + 4096, dtype=np.uint8)
    at = (-raw.ctypes.data) % 4096
    return raw[at : at + size]


def measure(
    address: str, size: int, ops: int, transport: str, profile: int, own: int = 0,
    master_pid: int = 0, node_pid: int = 0, tier: Tier | None = None, aligned: bool = False,
) -> list[dict[str, Any]]:  # fmt: skip
    stages = Stages()
    buf = page_aligned(size * 2) if aligned else np.empty(size * 2, dtype=np.uint8)
    buf[:] = np.random.default_rng(0).integers(0, 255, size * 2, dtype=np.uint8)
    out = page_aligned(size) if aligned else np.empty(size, dtype=np.uint8)
    kw: dict[str, Any] = {} if tier is None else {"tier": tier}
    prefix = uuid.uuid4().hex[:8]
    with Client(address, transport=transport, segment_bytes=own) as c:
        c.register_buffer(buf)
        c.register_buffer(out)
        instrument(c, stages)
        c.put_from(f"{prefix}-warm", buf, 0, size, **kw)  # connections, directory, lane
        c.get_into(f"{prefix}-warm", out)
        rows = [
            run_phase(
                "put",
                ops,
                lambda i: c.put_from(f"{prefix}-{i}", buf, 0, size, **kw),
                stages,
                profile,
                master_pid,
                node_pid,
            ),
            run_phase(
                "get",
                ops,
                lambda i: c.get_into(f"{prefix}-{i}", out),
                stages,
                profile,
                master_pid,
                node_pid,
            ),
        ]
        assert bytes(out) == bytes(buf[:size]), "the last get read wrong bytes"
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-kib", type=int, default=1024)
    p.add_argument("--ops", type=int, default=200)
    p.add_argument("--transport", default="auto", choices=["auto", "shm", "tcp"])
    p.add_argument("--cprofile", type=int, default=0, metavar="N")
    p.add_argument(
        "--placement", choices=["remote", "own"], default="remote",
        help="own: the client lends the segment the objects go to (no storage node)",
    )  # fmt: skip
    p.add_argument("--tier", choices=["dram", "ssd"], default="dram")
    p.add_argument("--aligned", action="store_true", help="page-aligned client buffers")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    size = args.size_kib << 10
    dram_mib = max(256, size * (args.ops + 2) * 2 // MiB)
    own = dram_mib << 20 if args.placement == "own" else 0
    if own and args.tier == "ssd":
        p.error("--tier ssd needs --placement remote (a node's SSD segment)")
    ssd = args.tier == "ssd"
    with pool(0 if own else dram_mib, dram_mib if ssd else 0) as (address, master_pid, node_pid):
        rows = measure(
            address, size, args.ops, args.transport, args.cprofile, own, master_pid, node_pid,
            Tier.SSD if ssd else None, args.aligned,
        )  # fmt: skip
    if args.json:
        print(json.dumps({"bench": "profile_ops", "size": size, "transport": args.transport,
                          "placement": args.placement, "tier": args.tier,
                          "aligned": args.aligned, "rows": rows}))  # fmt: skip
        return 0
    print(f"{size >> 10} KiB objects, transport {args.transport}, placement {args.placement}, "
          f"tier {args.tier}{', aligned buffers' if args.aligned else ''}, "
          f"{args.ops} ops per phase")  # fmt: skip
    for r in rows:
        parts = ", ".join(f"{k} {v:.0f}" for k, v in r["stages_us"].items())
        print(f"{r['phase']}: {r['us_per_op']:.0f} us/op (p50 {r['p50_us']:.0f}, "
              f"p99 {r['p99_us']:.0f}) = {parts}; cpu: client {r['client_cpu_us']:.0f}, "
              f"master {r['master_cpu_us']:.0f}, node {r['node_cpu_us']:.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
