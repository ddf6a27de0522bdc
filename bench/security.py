"""Benchmark: what the trust boundary costs the master's batched lookups: the same
BatchLookup batches (1000 keys) against a master process started insecure, with mTLS,
and with a token, in one run (rounds alternate so host noise spreads over all three).
Every mode runs the guard (limits and authorization); the secure ones add TLS and, for
a tenant-scoped client, its key checks. Target (issue 10): mTLS >= 0.8x of insecure.

    python bench/security.py [--quick] [--json] [--batch 1000] [--keys 20000]

`--data-plane`: what the data plane's security costs instead. TCP get (READ) and put
(WRITE) of 1 MiB and 16 MiB objects from a `kvstore.transfer.serve` process, four
such servers side by side in one run (rounds interleaved): plain, capabilities checked,
TLS, TLS + capabilities; same-host get by shared memory from the plain server and from
the secured one (its fd handed only for a capability); plus the cost of one capability
grant (the master) and check (the node) alone. Targets (issue 10): TCP get with TLS and
same-host get, secured, >= 0.85x of plain.

    python bench/security.py --data-plane [--quick] [--json] [--rounds 5]

`--master-caps`: what issuing capabilities costs the master itself: CPU time of the
servicer's BatchLookup (1000 keys, reply serialized) in this process, capabilities off
and on, same state, rounds interleaved (CPU time: robust on a shared host).

    python bench/security.py --master-caps [--json] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from kvstore.edge import GRPC_OPTIONS  # noqa: E402
from kvstore.security.config import SecurityConfig  # noqa: E402
from kvstore.security.credentials import channel_credentials  # noqa: E402
from kvstore.transfer.serve import read_descriptor  # noqa: E402
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


async def lookups(
    address: str, sec: SecurityConfig | None, keys: list[str], batch: int, seconds: float,
    inflight: int, pid: int = 0,
) -> tuple[float, float, float]:  # fmt: skip
    """(looked-up keys per second, `inflight` batches at a time, for `seconds`; CPU
    microseconds per batch of the master process `pid` and of this process)."""
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

        start, cpu0, own0 = time.perf_counter(), _cpu_s(pid) if pid else 0.0, time.process_time()
        await asyncio.gather(*(worker(w) for w in range(inflight)))
        elapsed, batches = time.perf_counter() - start, done / batch
        master_cpu = (_cpu_s(pid) - cpu0) if pid else 0.0
        own_cpu = time.process_time() - own0
        return done / elapsed, master_cpu / batches * 1e6, own_cpu / batches * 1e6


DATA_TARGET = 0.85
MIB = 1 << 20
DATA_MODES = ("plain", "caps", "tls", "tls+caps")


@dataclass
class _Served:
    proc: subprocess.Popen[bytes]
    desc: Any


def _serve(name: str, size: int, tls: SecurityConfig | None, key: Any, clock_ms: int) -> _Served:
    args = [sys.executable, "-m", "kvstore.transfer.serve", "--name", name, "--size",
            str(size), "--seed", "1"]  # fmt: skip
    if tls is not None:
        args += ["--tls-ca", tls.ca_file, "--tls-cert", tls.cert_file, "--tls-key", tls.key_file]
    if key is not None:
        args += ["--capability-key", key.secret.hex(), "--key-id", str(key.key_id),
                 "--clock-ms", str(clock_ms)]  # fmt: skip
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None
    return _Served(proc, read_descriptor(proc.stdout))


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Cpu:
    """CPU seconds per (row, mode): this process's and the serving process's."""

    def __init__(self) -> None:
        self.cpu: dict[str, dict[str, float]] = {}
        self.bytes: dict[str, dict[str, int]] = {}

    def measure(self, row: str, mode: str, pid: int, nbytes: int, fn: Any) -> Any:
        c0, s0 = time.process_time(), _cpu_s(pid)
        out = fn()
        cpu = time.process_time() - c0 + _cpu_s(pid) - s0
        self.cpu.setdefault(row, {}).setdefault(mode, 0.0)
        self.cpu[row][mode] += cpu
        self.bytes.setdefault(row, {}).setdefault(mode, 0)
        self.bytes[row][mode] += nbytes
        return out

    def ns_per_byte(self) -> dict[str, dict[str, float]]:
        return {
            row: {m: self.cpu[row][m] / self.bytes[row][m] * 1e9 for m in by}
            for row, by in self.cpu.items()
        }


def _timed_batch(engine: Any, reqs: list[Any]) -> float:
    start = time.perf_counter()
    results = engine.submit(reqs).wait(60)
    elapsed = time.perf_counter() - start
    assert all(r is None for r in results), results
    return elapsed


def data_plane(args: argparse.Namespace) -> dict[str, Any]:
    from kvstore.security.capabilities import READ, WRITE, Issuer, Keyring
    from kvstore.security.credentials import data_plane_client
    from kvstore.transfer.base import TransferOp, TransferRequest
    from kvstore.transfer.shm import ShmEngine
    from kvstore.transfer.tcp import TcpConfig, TcpEngine

    work = Path(tempfile.mkdtemp(prefix="kvs-bench-dp-"))
    atexit.register(shutil.rmtree, work, True)  # keys, logs: nothing left behind
    pki = Pki(work / "pki")
    issuer = Issuer()
    key = issuer.rotate("n1")
    batch_bytes = 16 * MIB if args.quick else 32 * MIB
    sizes = (1 * MIB, 16 * MIB)
    served = {}
    try:
        for i, mode in enumerate(DATA_MODES):
            tls = pki.tls("n1") if "tls" in mode else None
            caps = key if "caps" in mode else None
            served[mode] = _serve(f"kvs-bench-dp-{os.getpid()}-{i}", batch_bytes, tls, caps,
                                  issuer.now_ms())  # fmt: skip
        client_tls = data_plane_client(pki.tls("alice-1"))
        engines = {
            m: TcpEngine(TcpConfig(connections=args.connections,
                                   tls=client_tls if "tls" in m else None))
            for m in DATA_MODES
        }  # fmt: skip
        local = bytearray(batch_bytes)
        bufs = {m: e.register("local", local) for m, e in engines.items()}
        gbps: dict[str, dict[str, list[float]]] = {}
        cpu = _Cpu()
        for _ in range(args.rounds):
            for size in sizes:
                n = batch_bytes // size
                for op, mode_flag in ((TransferOp.READ, READ), (TransferOp.WRITE, WRITE)):
                    for m in DATA_MODES:
                        desc = served[m].desc
                        reqs = []
                        for j in range(n):
                            cap = b""
                            if "caps" in m:  # granted per batch, as a lookup would
                                cap = issuer.grant("n1", desc.name, j * size, size, mode_flag,
                                                   60.0)  # fmt: skip
                            reqs.append(TransferRequest(op, desc, j * size, size, bufs[m],
                                                        j * size, cap))  # fmt: skip
                        _timed_batch(engines[m], reqs)  # warm connections and pages
                        row = f"{'get' if op == TransferOp.READ else 'put'} {size // MIB} MiB"

                        def repeats(e: Any = engines[m], r: list[Any] = reqs) -> list[float]:
                            return [_timed_batch(e, r) for _ in range(args.repeat)]

                        pid = served[m].proc.pid
                        times = cpu.measure(row, m, pid, args.repeat * batch_bytes, repeats)
                        best = min(times)
                        gbps.setdefault(row, {}).setdefault(m, []).append(batch_bytes / best / 1e9)
        shm = ShmEngine()  # same host: plain vs a segment whose fd needs a capability
        shm_buf = shm.register("local", local)
        for _ in range(args.rounds):
            for size in sizes:
                n = batch_bytes // size
                for m in ("plain", "tls+caps"):
                    desc = served[m].desc
                    reqs = [
                        TransferRequest(TransferOp.READ, desc, j * size, size, shm_buf, j * size,
                                        issuer.grant("n1", desc.name, j * size, size, READ, 60.0)
                                        if "caps" in m else b"")
                        for j in range(n)
                    ]  # fmt: skip
                    _timed_batch(shm, reqs)  # maps the segment (the fd request, checked)
                    row = f"shm get {size // MIB} MiB"
                    times = cpu.measure(row, m, served[m].proc.pid, args.repeat * batch_bytes,
                                        lambda r=reqs: [_timed_batch(shm, r)
                                                        for _ in range(args.repeat)])  # fmt: skip
                    best = min(times)
                    gbps.setdefault(row, {}).setdefault(m, []).append(batch_bytes / best / 1e9)
        shm.close()
        for e in engines.values():
            e.close()
    finally:
        for s in served.values():
            assert s.proc.stdin is not None
            s.proc.stdin.close()
            s.proc.wait(30)
    ring = Keyring("n1")
    ring.install(key.secret, key.key_id, issuer.now_ms(), time.monotonic())
    cap = issuer.grant("n1", "kvs-seg", 4096, MIB, READ, 60.0)
    n = 20_000
    start = time.perf_counter()
    for _ in range(n):
        issuer.grant("n1", "kvs-seg", 4096, MIB, READ, 60.0)
    grant_us = (time.perf_counter() - start) / n * 1e6
    start = time.perf_counter()
    for _ in range(n):
        ring.check("kvs-seg", 4096, MIB, READ, cap)
    check_us = (time.perf_counter() - start) / n * 1e6
    med = {row: {m: statistics.median(v) for m, v in by.items()} for row, by in gbps.items()}
    best = {row: {m: max(v) for m, v in by.items()} for row, by in gbps.items()}
    ns = cpu.ns_per_byte()
    ratios = {
        row: {m: by[m] / by["plain"] for m in DATA_MODES if m != "plain" and m in by}
        for row, by in med.items()
    }
    return {
        "gbps": med, "rounds": gbps, "vs_plain": ratios, "batch_bytes": batch_bytes,
        "best_gbps": best, "cpu_ns_per_byte": ns,
        "best_vs_plain": {
            row: {m: by[m] / by["plain"] for m in by if m != "plain"} for row, by in best.items()
        },
        "cpu_vs_plain": {
            row: {m: by["plain"] / by[m] for m in by if m != "plain"} for row, by in ns.items()
        },
        "connections": args.connections, "grant_us": grant_us, "check_us": check_us,
        "target_tls_get": DATA_TARGET,
    }  # fmt: skip


def master_caps(args: argparse.Namespace) -> dict[str, Any]:
    from kvstore.master.config import MasterConfig
    from kvstore.master.metadata import MasterState
    from kvstore.master.model import Endpoint
    from kvstore.master.service import MasterServicer
    from kvstore.security.capabilities import Issuer
    from kvstore.types import Tier

    state = MasterState(MasterConfig())
    svc = MasterServicer(state, "epoch")
    issuer = Issuer()
    for node in ("n1", "n2"):
        state.register_node(node, Endpoint())
        state.mount_segment(node, f"{node}-dram", Tier.DRAM, 1 << 40)
        issuer.rotate(node)
    keys = [f"alice/{i:032x}" for i in range(args.keys)]
    batches = [keys[i : i + args.batch] for i in range(0, len(keys), args.batch)]

    async def prepare() -> None:
        for part in batches:
            items = [master_pb2.PutStartItem(key=k, size=4096) for k in part]
            await svc.PutStart(master_pb2.PutStartRequest(client_id="c", items=items), None)
            await svc.PutEnd(master_pb2.PutEndRequest(client_id="c", keys=part), None)

    async def lookups(n: int) -> float:
        start = time.process_time()
        for i in range(n):
            req = master_pb2.BatchLookupRequest(keys=batches[i % len(batches)], lease_ttl_ms=5000)
            (await svc.BatchLookup(req, None)).SerializeToString()
        return (time.process_time() - start) / n * 1e3

    asyncio.run(prepare())
    ms: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(args.rounds):
        for mode in ("off", "on"):
            svc.caps = issuer if mode == "on" else None
            ms[mode].append(asyncio.run(lookups(4 * len(batches))))
    med = {m: statistics.median(v) for m, v in ms.items()}
    return {
        "cpu_ms_per_batch": med, "rounds": ms, "batch": args.batch, "keys": args.keys,
        "on_vs_off": med["off"] / med["on"], "cache_hits": svc.cap_cache.hits,
        "cache_misses": svc.cap_cache.misses,
    }  # fmt: skip


def print_data_plane(out: dict[str, Any], rounds: int) -> None:
    mib, conns = out["batch_bytes"] // MIB, out["connections"]
    print(f"TCP data plane, {mib} MiB per batch, {conns} connections, median of {rounds} rounds")
    print(f"  {'row':<12}{'plain GB/s':>12}" + "".join(f"{m:>18}" for m in DATA_MODES[1:]))
    for row, by in out["gbps"].items():
        cells = [
            f"{by[m]:.2f} ({out['vs_plain'][row][m]:.2f}x)" if m in by else "-"
            for m in DATA_MODES[1:]
        ]
        print(f"  {row:<12}{by['plain']:>12.2f}" + "".join(f"{c:>18}" for c in cells))
    print("best round, GB/s (vs plain) | CPU ns per byte, client + server (plain's / this)")
    for row, by in out["best_gbps"].items():
        cells = [f"{m} {v:.2f}" + (f" ({out['best_vs_plain'][row][m]:.2f}x)" if m != "plain"
                 else "") for m, v in by.items()]  # fmt: skip
        ns = out["cpu_ns_per_byte"][row]
        cpu = [f"{m} {v:.2f}" + (f" ({out['cpu_vs_plain'][row][m]:.2f}x)" if m != "plain"
               else "") for m, v in ns.items()]  # fmt: skip
        print(f"  {row:<12}{', '.join(cells)} | {', '.join(cpu)}")
    print(f"capability: grant {out['grant_us']:.2f} us, check {out['check_us']:.2f} us")
    gets = [out["vs_plain"][r]["tls"] for r in out["vs_plain"] if r.startswith("get")]
    verdict = "met" if min(gets) >= DATA_TARGET else "missed"
    print(f"target: TCP get with TLS >= {DATA_TARGET}x of plain -> {verdict}")
    shm = [out["vs_plain"][r]["tls+caps"] for r in out["vs_plain"] if r.startswith("shm")]
    verdict = "met" if shm and min(shm) >= DATA_TARGET else "missed"
    print(f"target: same-host (shm) get secured >= {DATA_TARGET}x of plain -> {verdict}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-plane", action="store_true")
    p.add_argument("--master-caps", action="store_true")
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--keys", type=int, default=20_000)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--inflight", type=int, default=4)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.master_caps:
        out = master_caps(args)
        if args.json:
            print(json.dumps(out, sort_keys=True))
        else:
            med = out["cpu_ms_per_batch"]
            print(f"master BatchLookup of {args.batch} keys, CPU ms per batch (median of "
                  f"{args.rounds}): capabilities off {med['off']:.2f}, on {med['on']:.2f} -> "
                  f"{out['on_vs_off']:.2f}x; reply cache {out['cache_hits']} hits, "
                  f"{out['cache_misses']} misses")  # fmt: skip
        return 0
    if args.data_plane:
        if args.quick:
            args.rounds, args.repeat = 1, 2
        out = data_plane(args)
        if args.json:
            print(json.dumps(out, sort_keys=True))
        else:
            print_data_plane(out, args.rounds)
        return 0
    if args.quick:
        args.keys, args.seconds, args.rounds = 5000, 1.0, 1
    work = Path(tempfile.mkdtemp(prefix="kvs-bench-sec-"))
    atexit.register(shutil.rmtree, work, True)  # keys, logs: nothing left behind
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
        cpu: dict[str, list[float]] = {n: [] for n in modes}  # master CPU us per batch
        client_cpu: dict[str, list[float]] = {n: [] for n in modes}
        for _ in range(args.rounds):
            for name, proc in zip(modes, procs, strict=True):
                run = lookups(addrs[name], modes[name][2], keysets[name], args.batch,
                              args.seconds, args.inflight, proc.proc.pid)  # fmt: skip
                rate, master_us, client_us = asyncio.run(run)
                rates[name].append(rate)
                cpu[name].append(master_us)
                client_cpu[name].append(client_us)
    finally:
        for proc in procs:
            proc.stop()
    med = {n: statistics.median(r) for n, r in rates.items()}
    cpu_med = {n: statistics.median(r) for n, r in cpu.items()}
    client_med = {n: statistics.median(r) for n, r in client_cpu.items()}
    out = {
        "keys_per_s": med, "rounds": rates, "batch": args.batch,
        "mtls_vs_insecure": med["mtls"] / med["insecure"],
        "token_vs_insecure": med["token"] / med["insecure"], "target": TARGET,
        "master_cpu_us_per_batch": cpu_med, "master_cpu_rounds": cpu,
        "client_cpu_us_per_batch": client_med,
        # CPU per batch of master + client, insecure's over this mode's: what the
        # throughput ratio would be on cores of their own (steadier on a shared host)
        "cpu_vs_insecure": {
            n: (cpu_med["insecure"] + client_med["insecure"]) / (cpu_med[n] + client_med[n])
            for n in modes
        },
    }  # fmt: skip
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    print(f"master BatchLookup, batches of {args.batch}, {args.inflight} in flight, "
          f"median of {args.rounds} rounds x {args.seconds} s")  # fmt: skip
    for name, value in med.items():
        ratio = value / med["insecure"]
        print(f"  {name:<9} {value:>12,.0f} keys/s  {ratio:.2f}x of insecure;  CPU us per "
              f"batch: master {cpu_med[name]:,.0f}, client {client_med[name]:,.0f} "
              f"({out['cpu_vs_insecure'][name]:.2f}x)")  # fmt: skip
    print(f"target: mTLS >= {TARGET}x of insecure -> "
          f"{'met' if out['mtls_vs_insecure'] >= TARGET else 'missed'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
