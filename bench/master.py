"""Benchmark: master metadata throughput (batched lookups, put start+end) and footprint.

Starts a real master process on 127.0.0.1 and drives it from this process with
grpc.aio: (a) BatchLookup of `--batch` keys per RPC, (b) PutStart+PutEnd of
`--batch` keys per RPC pair, (c) the baseline measured in the same run: the
same lookups one key per RPC. Requests are built before the clock starts (the
master's cost is measured, not this client's). "first time" is one pass over
keys never looked up. Targets: put start+end >= Mooncake's master, batched
lookups >= 250,000 keys/s. When Mooncake's `mooncake_master` and
`mooncake.store` are installed, the same batched lookup (`batch_get_replica_desc`)
and metadata-only two-phase put (`batch_put_session_start/end`) run against it
side by side, from its C++ client (one call at a time); otherwise the bench
says why and skips that column.

Footprint (`--footprint N,N,...`, default 1M and 10M objects): a fresh master
per size is filled with N committed objects (32-char keys, one replica each);
reported are its RSS growth per object (VmRSS after minus after mounting, over
N), its put rate while filling, and batched lookups/s of random keys at that
size. Target: <= 250 bytes of RSS per committed object at 10M objects, lookups
still >= 250,000 keys/s. Results go to bench/results/master.json (`--save`).

    python bench/master.py [--quick] [--json] [--batch N] [--keys N] [--inflight N]
                           [--footprint 1000000,10000000] [--save PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvstore.master.server import grpc_options
from kvstore.master.wire import field, varint
from kvstore.v1 import common_pb2, master_pb2, master_pb2_grpc

TARGET_LOOKUPS = 250_000
TARGET_BYTES_PER_OBJECT = 250
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "master.json")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, help="objects written (default 100k, quick 20k)")
    p.add_argument("--batch", type=int, default=1000, help="keys per batched RPC")
    p.add_argument("--inflight", type=int, default=4, help="concurrent RPCs")
    p.add_argument("--seconds", type=float, help="time per lookup measurement")
    p.add_argument("--no-mooncake", action="store_true", help="skip the Mooncake column")
    p.add_argument(
        "--footprint", help="object counts for the footprint rows (default 1M,10M; quick 200k)"
    )
    p.add_argument("--save", default=None, help=f"write the JSON here (default {RESULTS})")
    p.add_argument("--quick", action="store_true", help="short run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# A master without the security guard (kvstore.security): the same servicer, state and
# gRPC edge as kvstore.master.server.serve, for the rows that measure the metadata path.
_UNGUARDED = """
import asyncio
from kvstore import edge
from kvstore.master.config import MasterConfig
from kvstore.master.metadata import MasterState
from kvstore.master.server import _tick_forever
from kvstore.master.service import MasterServicer
from kvstore.v1 import master_pb2_grpc

async def main():
    config = MasterConfig(listen="127.0.0.1:{port}")
    servicer = MasterServicer(MasterState(config), "bench")
    add = lambda s: master_pb2_grpc.add_MasterServicer_to_server(servicer, s)
    server = await edge.start_server(config.listen, add, ["kvstore.v1.Master"],
                                     component="master", max_message_bytes=config.max_message_bytes)
    try:
        await _tick_forever(servicer, config.tick_interval_s)
    finally:
        await server.stop(0.5)

asyncio.run(main())
"""


@contextmanager
def master_process(port: int, guard: bool = True) -> Iterator[tuple[str, int]]:
    """A kvstore master in its own process (`guard`: as `kvstore master` runs it, with
    the security guard; else without); yields (address, pid) once it is SERVING."""
    code = f"from kvstore.master.server import run_master; run_master('127.0.0.1:{port}')"
    if not guard:
        code = _UNGUARDED.replace("{port}", str(port))
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    addr = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(addr) as ch:
            req = health_pb2.HealthCheckRequest(service="kvstore.v1.Master")
            health_pb2_grpc.HealthStub(ch).Check(req, timeout=20, wait_for_ready=True)
        yield addr, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def put_start_request(keys: list[str], size: int = 4096) -> master_pb2.PutStartRequest:
    """A PutStartRequest of `keys` (client "c"), from its encoding: cheap to build."""
    tail = b"\x10" + varint(size)
    items = b"".join(field(b"\x1a", field(b"\x0a", k.encode()) + tail) for k in keys)
    return master_pb2.PutStartRequest.FromString(b"\x0a\x01c" + items)


def key_of(i: int) -> str:
    return f"{i:032x}"


async def mount_pool(stub: master_pb2_grpc.MasterStub) -> asyncio.Task[None]:
    """One node with a 1 TiB DRAM segment (metadata only: nothing is allocated); the
    task that heartbeats for it (else the master declares it dead after node_ttl_s)."""
    await stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id="n1"))
    await stub.MountSegment(
        master_pb2.MountSegmentRequest(
            node_id="n1", segment="s", tier=common_pb2.TIER_DRAM, capacity=1 << 40
        )
    )

    async def beat() -> None:
        while True:
            await asyncio.sleep(1.0)
            await stub.Heartbeat(master_pb2.HeartbeatRequest(node_id="n1"))

    return asyncio.create_task(beat())


async def put_all(
    stub: master_pb2_grpc.MasterStub, start: int, n: int, batch: int, inflight: int
) -> float:
    """PutStart + PutEnd keys start..start+n, `inflight` batches at a time; keys/s (the
    requests of a batch are built here, ~0.5 us a key, while others are in flight)."""
    bounds = [(i, min(start + n, i + batch)) for i in range(start, start + n, batch)]
    queue = iter(bounds)

    async def worker() -> None:
        for lo, hi in queue:
            keys = [key_of(i) for i in range(lo, hi)]
            ps, pe = put_start_request(keys), master_pb2.PutEndRequest(client_id="c", keys=keys)
            res = await stub.PutStart(ps)
            await stub.PutEnd(pe)
            assert res.results[0].status.code == 0, res.results[0].status.message

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    return n / (time.perf_counter() - start)


async def gather_limited(jobs: list[Callable[[], Awaitable[None]]], inflight: int) -> None:
    queue = iter(jobs)

    async def worker() -> None:
        for job in queue:
            await job()

    await asyncio.gather(*(worker() for _ in range(inflight)))


async def bench_kvstore(addr: str, args: argparse.Namespace) -> dict[str, float]:
    async with grpc.aio.insecure_channel(addr, options=grpc_options()) as ch:
        stub = master_pb2_grpc.MasterStub(ch)
        beat = await mount_pool(stub)
        keys = [key_of(i) for i in range(args.keys)]
        batches = [keys[i : i + args.batch] for i in range(0, len(keys), args.batch)]
        reqs = [
            (put_start_request(b), master_pb2.PutEndRequest(client_id="c", keys=b)) for b in batches
        ]

        async def put(ps: master_pb2.PutStartRequest, pe: master_pb2.PutEndRequest) -> None:
            await stub.PutStart(ps)
            await stub.PutEnd(pe)

        start = time.perf_counter()
        await gather_limited([lambda r=r: put(*r) for r in reqs], args.inflight)
        put_rate = len(keys) / (time.perf_counter() - start)

        lreqs = [master_pb2.BatchLookupRequest(keys=b) for b in batches]
        singles = [master_pb2.BatchLookupRequest(keys=[k]) for k in keys[:10_000]]

        async def lookup(req: master_pb2.BatchLookupRequest) -> None:
            res = await stub.BatchLookup(req)
            assert len(res.results) == len(req.keys) and res.results[0].status.code == 0

        start = time.perf_counter()  # first lookup of each key
        await gather_limited([lambda r=r: lookup(r) for r in lreqs], args.inflight)
        cold = len(keys) / (time.perf_counter() - start)
        batched = await rate(lambda i: lookup(lreqs[i % len(lreqs)]), args)
        single = await rate(lambda i: lookup(singles[i % len(singles)]), args)
        beat.cancel()
    return {
        "put_keys_per_s": put_rate,
        "lookup_keys_per_s": batched * args.batch,
        "lookup_first_keys_per_s": cold,
        "lookup_unbatched_keys_per_s": single,
    }


async def rate(call: Callable[[int], Awaitable[None]], args: argparse.Namespace) -> float:
    """Calls per second of `call`, `inflight` at a time, for `seconds`."""
    done = 0
    deadline = time.perf_counter() + args.seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await call(done)
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.inflight)))
    return done / (time.perf_counter() - start)


async def bench_footprint(n: int, args: argparse.Namespace, guard: bool = True) -> dict[str, float]:
    """A fresh master filled with `n` committed objects: RSS per object, put and lookup rates."""
    with master_process(free_port(), guard) as (addr, pid):
        async with grpc.aio.insecure_channel(addr, options=grpc_options()) as ch:
            stub = master_pb2_grpc.MasterStub(ch)
            beat = await mount_pool(stub)
            await put_all(stub, 0, args.batch, args.batch, 1)  # warm up: first batch
            await asyncio.sleep(1.0)
            before = rss_bytes(pid)
            put_rate = await put_all(stub, args.batch, n - args.batch, args.batch, args.inflight)
            await asyncio.sleep(1.0)  # a tick or two: nothing in flight
            after = rss_bytes(pid)
            rng = random.Random(n)
            picks = [[key_of(rng.randrange(n)) for _ in range(args.batch)] for _ in range(64)]
            lreqs = [master_pb2.BatchLookupRequest(keys=keys) for keys in picks]

            async def lookup(req: master_pb2.BatchLookupRequest) -> None:
                res = await stub.BatchLookup(req)
                assert res.results[-1].status.code == 0

            looked = await rate(lambda i: lookup(lreqs[i % len(lreqs)]), args) * args.batch
            stats = await stub.Stats(master_pb2.StatsRequest())
            assert stats.objects == n, f"{stats.objects} objects, wanted {n}"
            end = rss_bytes(pid)
            beat.cancel()
    return {
        "objects": n, "rss_mounted_mib": before / 2**20, "rss_filled_mib": after / 2**20,
        "rss_after_lookups_mib": end / 2**20, "bytes_per_object": (after - before) / n,
        "put_keys_per_s": put_rate, "lookup_keys_per_s": looked,
    }  # fmt: skip


def core_probe(n: int, batch: int) -> dict[str, float]:
    """(In a fresh process.) The metadata core alone, `MasterState` with no gRPC, guard
    or journal, filled with `n` committed objects the way the servicer fills it: RSS
    growth per object and the core's put rate (CPU seconds)."""
    from kvstore.master.batch import PutColumns
    from kvstore.master.config import MasterConfig
    from kvstore.master.metadata import MasterState
    from kvstore.master.model import Endpoint
    from kvstore.types import Tier

    state = MasterState(MasterConfig())
    state.register_node("n1", Endpoint())
    state.mount_segment("n1", "s", Tier.DRAM, 1 << 40)
    before = rss_bytes(os.getpid())
    cpu = 0.0
    for lo in range(0, n, batch):
        keys = [key_of(i) for i in range(lo, min(n, lo + batch))]
        m = len(keys)
        cols = PutColumns(keys, [4096] * m, [1] * m, [""] * m, [""] * m, [-1] * m, [0.0] * m)
        t = time.process_time()
        state.put_start_columns("c", "", cols)
        state.put_end_durable("c", keys)
        cpu += time.process_time() - t
    del keys, cols
    after = rss_bytes(os.getpid())
    return {"objects": n, "bytes_per_object": (after - before) / n, "put_keys_per_cpu_s": n / cpu}


def bench_core(n: int, args: argparse.Namespace) -> dict[str, float]:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import master; "
        "print(json.dumps(master.core_probe(int(sys.argv[2]), int(sys.argv[3]))))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", code, here, str(n), str(args.batch)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_mooncake(args: argparse.Namespace) -> dict[str, float] | str:
    """Mooncake's master driven through its store client, or the reason it cannot run."""
    binary = shutil.which("mooncake_master")
    try:
        from mooncake.store import MooncakeDistributedStore  # type: ignore[import-not-found]
    except ImportError as exc:
        return f"mooncake.store not importable ({exc.name or exc})"
    if binary is None:
        return "mooncake_master binary not on PATH"
    port = free_port()
    env = dict(os.environ, MC_TCP_BIND_ADDRESS="127.0.0.1")
    cmd = [
        binary, "-rpc_address=127.0.0.1", f"-rpc_port={port}",
        "-enable_http_metadata_server=true", "-http_metadata_server_host=127.0.0.1",
        f"-http_metadata_server_port={free_port()}",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"
    try:
        return _drive_mooncake(MooncakeDistributedStore(), port, cmd, args)
    except Exception as exc:  # report, never crash the kvstore columns
        return f"mooncake failed: {exc!r}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _drive_mooncake(store, port: int, cmd: list[str], args: argparse.Namespace):  # type: ignore[no-untyped-def]
    meta = next(c for c in cmd if c.startswith("-http_metadata_server_port=")).split("=")[1]
    deadline = time.monotonic() + 20
    rc = -1
    while time.monotonic() < deadline:
        rc = store.setup(
            "127.0.0.1", f"http://127.0.0.1:{meta}/metadata", 512 << 20, 128 << 20, "tcp", "",
            f"127.0.0.1:{port}",
        )  # fmt: skip
        if rc == 0:
            break
        time.sleep(0.2)
    if rc != 0:
        raise RuntimeError(f"setup returned {rc}")
    keys = [f"{i:032x}" for i in range(args.keys)]
    batches = [keys[i : i + args.batch] for i in range(0, len(keys), args.batch)]
    start = time.perf_counter()
    for b in batches:  # metadata-only two-phase put, like PutStart/PutEnd
        assert store.batch_put_session_start(b, [4096] * len(b)) == [0] * len(b)
        assert store.batch_put_session_end(b) == [0] * len(b)
    put_rate = len(keys) / (time.perf_counter() - start)

    def lookup(i: int) -> None:  # replica descriptors: the analogue of BatchLookup
        assert len(store.batch_get_replica_desc(batches[i % len(batches)])) == args.batch

    def exists(i: int) -> None:
        assert len(store.batch_is_exist(batches[i % len(batches)])) == args.batch

    result = {
        "put_keys_per_s": put_rate,
        "lookup_keys_per_s": sync_rate(lookup, args.seconds) * args.batch,
        "exists_keys_per_s": sync_rate(exists, args.seconds) * args.batch,
    }
    store.close()
    return result


def sync_rate(call: Callable[[int], None], seconds: float) -> float:
    """Calls per second of `call`, one at a time, for `seconds`."""
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        call(done)
        done += 1
    return done / (time.perf_counter() - start)


def run(args: argparse.Namespace) -> dict[str, object]:
    args.keys = args.keys or (20_000 if args.quick else 100_000)
    args.seconds = args.seconds or (1.0 if args.quick else 3.0)
    sizes = args.footprint or ("200000" if args.quick else "1000000,10000000")
    with master_process(free_port()) as (addr, _):
        ours = asyncio.run(bench_kvstore(addr, args))
    with master_process(free_port(), guard=False) as (addr, _):
        unguarded = asyncio.run(bench_kvstore(addr, args))
    mooncake = "skipped (--no-mooncake)" if args.no_mooncake else bench_mooncake(args)
    footprint = []
    for n in [int(x) for x in sizes.split(",") if x]:
        row = asyncio.run(bench_footprint(n, args))
        row["unguarded"] = asyncio.run(bench_footprint(n, args, guard=False))
        row["core"] = bench_core(n, args)
        footprint.append(row)
    out: dict[str, object] = {
        "keys": args.keys, "batch": args.batch, "inflight": args.inflight, "kvstore": ours,
        "kvstore_unguarded": unguarded,
        "batched_vs_unbatched": ours["lookup_keys_per_s"] / ours["lookup_unbatched_keys_per_s"],
        "lookup_vs_target": ours["lookup_keys_per_s"] / TARGET_LOOKUPS,
        "mooncake": mooncake, "footprint": footprint,
        "machine": {"cpus": os.cpu_count(), "load_avg_at_end": list(os.getloadavg())},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }  # fmt: skip
    if isinstance(mooncake, dict):
        out["lookup_vs_mooncake"] = ours["lookup_keys_per_s"] / mooncake["lookup_keys_per_s"]
        out["put_vs_mooncake"] = ours["put_keys_per_s"] / mooncake["put_keys_per_s"]
        out["put_unguarded_vs_mooncake"] = unguarded["put_keys_per_s"] / mooncake["put_keys_per_s"]
    return out


def print_table(r: dict[str, object]) -> None:
    ours, bare, mc = r["kvstore"], r["kvstore_unguarded"], r["mooncake"]
    assert isinstance(ours, dict) and isinstance(bare, dict)
    print(f"master bench: {r['keys']} keys, batch {r['batch']}, {r['inflight']} in flight")
    print(f"{'op':<28}{'kvstore keys/s':>16}{'(no guard)':>12}{'mooncake keys/s':>18}")
    for label, key in [
        ("batched lookup", "lookup_keys_per_s"),
        ("batched lookup, first time", "lookup_first_keys_per_s"),
        ("put start+end (batched)", "put_keys_per_s"),
        ("lookup, 1 key per RPC", "lookup_unbatched_keys_per_s"),
        ("exists only (mooncake)", "exists_keys_per_s"),
    ]:
        theirs = f"{mc[key]:,.0f}" if isinstance(mc, dict) and key in mc else "-"
        mine = f"{ours[key]:,.0f}" if key in ours else "-"
        plain = f"{bare[key]:,.0f}" if key in bare else "-"
        print(f"{label:<28}{mine:>16}{plain:>12}{theirs:>18}")
    print("(no guard: the same master without kvstore.security's per-call checks and ledger)")
    print(f"batched / unbatched lookup: {r['batched_vs_unbatched']:.1f}x")
    print(f"batched lookup / target {TARGET_LOOKUPS:,}: {r['lookup_vs_target']:.2f}x")
    if isinstance(mc, dict):
        print(
            f"vs mooncake: lookup {r['lookup_vs_mooncake']:.2f}x, put {r['put_vs_mooncake']:.2f}x "
            f"(no guard: {r['put_unguarded_vs_mooncake']:.2f}x)"
        )
    else:
        print(f"mooncake column skipped: {mc}")
    rows = r.get("footprint") or []
    if rows:
        print(
            f"footprint (target <= {TARGET_BYTES_PER_OBJECT} B/object, "
            f"lookups >= {TARGET_LOOKUPS:,}/s):"
        )
        cols = f"{'objects':>12}{'master':>12}{'RSS':>10}{'B/object':>10}"
        print(f"{cols}{'put keys/s':>12}{'lookups/s':>12}")
        for f in rows:
            for label, g in (("kvstore", f), ("no guard", f.get("unguarded"))):
                if g:
                    print(
                        f"{f['objects']:>12,}{label:>12}{g['rss_filled_mib']:>6.0f} MiB"
                        f"{g['bytes_per_object']:>10.0f}{g['put_keys_per_s']:>12,.0f}"
                        f"{g['lookup_keys_per_s']:>12,.0f}"
                    )
            core = f.get("core")
            if core:
                print(f"{f['objects']:>12,}{'core':>12}{'':>10}{core['bytes_per_object']:>10.0f}"
                      f"{core['put_keys_per_cpu_s']:>12,.0f}{'-':>12}")  # fmt: skip
        print("(B/object: RSS growth of the master process per committed object; core: the")
        print(" metadata core alone (MasterState, no gRPC), put rate in keys per CPU second)")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    save = args.save or (None if args.quick else RESULTS)
    if save:
        os.makedirs(os.path.dirname(os.path.abspath(save)), exist_ok=True)
        with open(save, "w") as f:
            json.dump(result, f, indent=1)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
