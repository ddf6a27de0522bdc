"""Benchmark: what the trust boundary costs the master's batched lookups: the same
BatchLookup batches (1000 keys) against a master process started insecure, with mTLS,
and with a token, in one run (rounds alternate so host noise spreads over all three).
Every mode runs the guard (limits and authorization); the secure ones add TLS and, for
a tenant-scoped client, its key checks. Target (issue 10): mTLS >= 0.8x of insecure.

    python bench/security.py [--quick] [--json] [--batch 1000] [--keys 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from kvstore.edge import GRPC_OPTIONS  # noqa: E402
from kvstore.security.config import SecurityConfig  # noqa: E402
from kvstore.security.credentials import channel_credentials  # noqa: E402
from kvstore.v1 import common_pb2, master_pb2, master_pb2_grpc  # noqa: E402
from tests.security.helpers import Pki, start_master  # noqa: E402

TARGET = 0.8


def aio_channel(address: str, sec: SecurityConfig | None) -> grpc.aio.Channel:
    creds = channel_credentials(sec) if sec is not None else None
    if creds is None:
        return grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
    return grpc.aio.secure_channel(address, creds, options=GRPC_OPTIONS)


async def prepare(address: str, node: SecurityConfig | None, writer: SecurityConfig | None,
                  who: str, keys: list[str], batch: int) -> None:  # fmt: skip
    async with aio_channel(address, node) as ch:
        stub = master_pb2_grpc.MasterStub(ch)
        await stub.RegisterNode(master_pb2.RegisterNodeRequest(
            node_id="n1", endpoint=common_pb2.NodeEndpoint(tcp_address="127.0.0.1:1")))  # fmt: skip
        await stub.MountSegment(master_pb2.MountSegmentRequest(
            node_id="n1", segment="s", tier=common_pb2.TIER_DRAM, capacity=1 << 40))  # fmt: skip
    async with aio_channel(address, writer) as ch:
        stub = master_pb2_grpc.MasterStub(ch)
        for i in range(0, len(keys), batch):
            part = keys[i : i + batch]
            items = [master_pb2.PutStartItem(key=k, size=4096) for k in part]
            await stub.PutStart(master_pb2.PutStartRequest(client_id=who, items=items))
            await stub.PutEnd(master_pb2.PutEndRequest(client_id=who, keys=part))


async def lookups(address: str, sec: SecurityConfig | None, keys: list[str], batch: int,
                  seconds: float, inflight: int) -> float:  # fmt: skip
    """Looked-up keys per second, `inflight` batches at a time, for `seconds`."""
    batches = [keys[i : i + batch] for i in range(0, len(keys), batch)]
    done = 0
    async with aio_channel(address, sec) as ch:
        stub = master_pb2_grpc.MasterStub(ch)
        await stub.BatchLookup(master_pb2.BatchLookupRequest(keys=batches[0]))  # warm
        deadline = time.perf_counter() + seconds

        async def worker(w: int) -> None:
            nonlocal done
            i = w
            while time.perf_counter() < deadline:
                res = await stub.BatchLookup(
                    master_pb2.BatchLookupRequest(keys=batches[i % len(batches)])
                )
                assert res.results[0].status.code == 0
                done += len(res.results)
                i += inflight

        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(inflight)))
        return done / (time.perf_counter() - start)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--keys", type=int, default=20_000)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--inflight", type=int, default=4)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.keys, args.seconds, args.rounds = 5000, 1.0, 1
    work = Path(tempfile.mkdtemp(prefix="kvs-bench-sec-"))
    pki = Pki(work / "pki")
    modes = {  # name: (server, node, client, client id, key prefix)
        "insecure": (None, None, None, "c", ""),
        "mtls": (pki.server(), pki.tls("n1"), pki.tls("alice-1"), "alice-1", "alice/"),
        "token": (pki.token_server(), pki.token_client("n1"), pki.token_client("alice-1"),
                  "alice-1", "alice/"),
    }  # fmt: skip
    procs, addrs, keysets = [], {}, {}
    try:
        for name, (server, node, client, who, prefix) in modes.items():
            addr, proc = start_master(work, server, "--node-ttl-s", "3600")  # no heartbeats here
            procs.append(proc)
            keys = [f"{prefix}{i:032x}" for i in range(args.keys)]
            asyncio.run(prepare(addr, node, client, who, keys, args.batch))
            addrs[name], keysets[name] = addr, keys
        rates: dict[str, list[float]] = {n: [] for n in modes}
        for _ in range(args.rounds):
            for name in modes:
                run = lookups(addrs[name], modes[name][2], keysets[name], args.batch,
                              args.seconds, args.inflight)  # fmt: skip
                rates[name].append(asyncio.run(run))
    finally:
        for proc in procs:
            proc.stop()
    med = {n: statistics.median(r) for n, r in rates.items()}
    out = {
        "keys_per_s": med, "rounds": rates, "batch": args.batch,
        "mtls_vs_insecure": med["mtls"] / med["insecure"],
        "token_vs_insecure": med["token"] / med["insecure"], "target": TARGET,
    }  # fmt: skip
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    print(f"master BatchLookup, batches of {args.batch}, {args.inflight} in flight, "
          f"median of {args.rounds} rounds x {args.seconds} s")  # fmt: skip
    for name, value in med.items():
        ratio = value / med["insecure"]
        print(f"  {name:<9} {value:>12,.0f} keys/s  {ratio:.2f}x of insecure")
    print(f"target: mTLS >= {TARGET}x of insecure -> "
          f"{'met' if out['mtls_vs_insecure'] >= TARGET else 'missed'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
