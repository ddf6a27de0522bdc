"""Benchmark: master metadata throughput (batched lookups, put start+end), over gRPC.

Starts a real master process on 127.0.0.1 and drives it from this process with
grpc.aio: (a) BatchLookup of `--batch` keys per RPC, (b) PutStart+PutEnd of
`--batch` keys per RPC pair, (c) the baseline measured in the same run: the
same lookups one key per RPC. Repeated lookups hit the master's per-object
cache of encoded results; "first time" is one pass over keys never looked up.
Reports keys/s and the batched/unbatched ratio; target: >= 50,000 batched
lookups/s on a 2-core machine. When Mooncake's
`mooncake_master` and `mooncake.store` are installed, the same batched lookup
(`batch_get_replica_desc`) and metadata-only two-phase put
(`batch_put_session_start/end`) run against it side by side, from its C++
client (one call at a time); otherwise the bench says why and skips that column.

    python bench/master.py [--quick] [--json] [--batch N] [--keys N] [--inflight N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
from kvstore.v1 import common_pb2, master_pb2, master_pb2_grpc

TARGET_LOOKUPS = 50_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, help="objects written (default 100k, quick 20k)")
    p.add_argument("--batch", type=int, default=1000, help="keys per batched RPC")
    p.add_argument("--inflight", type=int, default=4, help="concurrent RPCs")
    p.add_argument("--seconds", type=float, help="time per lookup measurement")
    p.add_argument("--no-mooncake", action="store_true", help="skip the Mooncake column")
    p.add_argument("--quick", action="store_true", help="short run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def master_process(port: int) -> Iterator[str]:
    """A kvstore master in its own process; yields its address once it is SERVING."""
    code = f"from kvstore.master.server import run_master; run_master('127.0.0.1:{port}')"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
    addr = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(addr) as ch:
            req = health_pb2.HealthCheckRequest(service="kvstore.v1.Master")
            health_pb2_grpc.HealthStub(ch).Check(req, timeout=20, wait_for_ready=True)
        yield addr
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def gather_limited(jobs: list[Callable[[], Awaitable[None]]], inflight: int) -> None:
    queue = iter(jobs)

    async def worker() -> None:
        for job in queue:
            await job()

    await asyncio.gather(*(worker() for _ in range(inflight)))


async def bench_kvstore(addr: str, args: argparse.Namespace) -> dict[str, float]:
    async with grpc.aio.insecure_channel(addr, options=grpc_options()) as ch:
        stub = master_pb2_grpc.MasterStub(ch)
        await stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id="n1"))
        await stub.MountSegment(
            master_pb2.MountSegmentRequest(
                node_id="n1", segment="s", tier=common_pb2.TIER_DRAM, capacity=1 << 40
            )
        )
        keys = [f"{i:032x}" for i in range(args.keys)]
        batches = [keys[i : i + args.batch] for i in range(0, len(keys), args.batch)]

        async def put(batch: list[str]) -> None:
            items = [master_pb2.PutStartItem(key=k, size=4096) for k in batch]
            await stub.PutStart(master_pb2.PutStartRequest(client_id="c", items=items))
            await stub.PutEnd(master_pb2.PutEndRequest(client_id="c", keys=batch))

        start = time.perf_counter()
        await gather_limited([lambda b=b: put(b) for b in batches], args.inflight)
        put_rate = len(keys) / (time.perf_counter() - start)

        async def lookup(batch: list[str]) -> None:
            res = await stub.BatchLookup(master_pb2.BatchLookupRequest(keys=batch))
            assert len(res.results) == len(batch)

        start = time.perf_counter()  # first lookup of each key: nothing cached yet
        await gather_limited([lambda b=b: lookup(b) for b in batches], args.inflight)
        cold = len(keys) / (time.perf_counter() - start)
        batched = await rate(lambda i: lookup(batches[i % len(batches)]), args)
        single = await rate(lambda i: lookup([keys[i % len(keys)]]), args)
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
    with master_process(free_port()) as addr:
        ours = asyncio.run(bench_kvstore(addr, args))
    mooncake = "skipped (--no-mooncake)" if args.no_mooncake else bench_mooncake(args)
    out: dict[str, object] = {
        "keys": args.keys, "batch": args.batch, "inflight": args.inflight, "kvstore": ours,
        "batched_vs_unbatched": ours["lookup_keys_per_s"] / ours["lookup_unbatched_keys_per_s"],
        "lookup_vs_target": ours["lookup_keys_per_s"] / TARGET_LOOKUPS,
        "mooncake": mooncake,
    }  # fmt: skip
    if isinstance(mooncake, dict):
        out["lookup_vs_mooncake"] = ours["lookup_keys_per_s"] / mooncake["lookup_keys_per_s"]
        out["put_vs_mooncake"] = ours["put_keys_per_s"] / mooncake["put_keys_per_s"]
    return out


def print_table(r: dict[str, object]) -> None:
    ours = r["kvstore"]
    mc = r["mooncake"]
    assert isinstance(ours, dict)
    print(f"master bench: {r['keys']} keys, batch {r['batch']}, {r['inflight']} in flight")
    print(f"{'op':<28}{'kvstore keys/s':>16}{'mooncake keys/s':>18}")
    for label, key in [
        ("batched lookup", "lookup_keys_per_s"),
        ("batched lookup, first time", "lookup_first_keys_per_s"),
        ("put start+end (batched)", "put_keys_per_s"),
        ("lookup, 1 key per RPC", "lookup_unbatched_keys_per_s"),
        ("exists only (mooncake)", "exists_keys_per_s"),
    ]:
        theirs = f"{mc[key]:,.0f}" if isinstance(mc, dict) and key in mc else "-"
        mine = f"{ours[key]:,.0f}" if key in ours else "-"
        print(f"{label:<28}{mine:>16}{theirs:>18}")
    print(f"batched / unbatched lookup: {r['batched_vs_unbatched']:.1f}x")
    print(f"batched lookup / target {TARGET_LOOKUPS:,}: {r['lookup_vs_target']:.2f}x")
    if isinstance(mc, dict):
        print(
            f"vs mooncake: lookup {r['lookup_vs_mooncake']:.2f}x, put {r['put_vs_mooncake']:.2f}x"
        )
    else:
        print(f"mooncake column skipped: {mc}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
