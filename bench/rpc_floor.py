"""What one master round trip costs: gRPC vs the fast lane, against their floors.

Sequential request/reply loops from this process, each to a server in another
process, microseconds per call (median of --rounds rounds of --calls calls):

    grpc.aio floor          a bare grpc.aio server's health Check (no kvstore code)
    socket floor            a length-prefixed echo to an asyncio Protocol over loopback
                            TCP (no kvstore code)
    unix socket floor       the same echo over an abstract Unix socket
    master gRPC             BatchLookup of one missing key on a `kvstore master`, over gRPC
    master fast lane        the same request over the master's fast lane (kvstore.fastlane),
                            TCP
    master fast lane, unix  the same over the lane's Unix socket (what a client on the
                            master's host uses)

The fast lane's ratio is against the master over gRPC; the floors say how much of
each is transport and how much is the master's own work.

    python bench/rpc_floor.py [--calls 2000] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # noqa: E402

from kvstore.fastlane import UNIX, SyncLane, _connect  # noqa: E402
from kvstore.v1 import master_pb2, master_pb2_grpc  # noqa: E402


def _grpc_server(out: Connection) -> None:
    async def main() -> None:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        out.send(port)
        await server.wait_for_termination()

    asyncio.run(main())


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport, self.buf = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 4:
            (n,) = struct.unpack_from("<I", self.buf)
            if len(self.buf) < 4 + n:
                return
            frame, self.buf = self.buf[: 4 + n], self.buf[4 + n :]
            self.transport.write(frame)


def _socket_server(out: Connection) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Echo, "127.0.0.1", 0)
        out.send(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        await server.serve_forever()

    asyncio.run(main())


def _unix_server(out: Connection) -> None:
    async def main() -> None:
        name = f"kvstore-rpc-floor-{os.getpid()}"
        server = await asyncio.get_running_loop().create_unix_server(_Echo, "\0" + name)
        out.send(f"{UNIX}{name}")
        await server.serve_forever()

    asyncio.run(main())


def _echo_floor(address: str, calls: int, rounds: int) -> float:
    with _connect(address, 5.0) as s:
        frame = struct.pack("<I", 32) + b"x" * 32

        def echo() -> None:
            s.sendall(frame)
            got = 0
            while got < len(frame):
                got += len(s.recv(len(frame) - got))

        return _time(echo, calls, rounds)


def _spawn(target: Callable[[Connection], None]) -> tuple[mp.process.BaseProcess, Any]:
    ctx = mp.get_context("spawn")
    rx, tx = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(tx,), daemon=True)
    proc.start()
    return proc, rx.recv()


def _time(fn: Callable[[], object], calls: int, rounds: int) -> float:
    for _ in range(100):
        fn()
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows: dict[str, float] = {}
    proc, port = _spawn(_grpc_server)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        rows["grpc.aio floor"] = _time(
            lambda: stub.Check(health_pb2.HealthCheckRequest()), args.calls, args.rounds
        )
    proc.terminate()
    for label, server in (("socket floor", _socket_server), ("unix socket floor", _unix_server)):
        proc, address = _spawn(server)
        rows[label] = _echo_floor(address, args.calls, args.rounds)
        proc.terminate()
    cmd = [sys.executable, "-m", "cli.main", "master", "--listen", "127.0.0.1:0"]
    master = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO)
    try:
        assert master.stdout is not None
        address = master.stdout.readline().split()[4].decode()
        request = master_pb2.BatchLookupRequest(keys=["absent"], no_lease=True)
        with grpc.insecure_channel(address) as ch:
            stub = master_pb2_grpc.MasterStub(ch)
            rows["master gRPC"] = _time(lambda: stub.BatchLookup(request), args.calls, args.rounds)
            stats = stub.Stats(master_pb2.StatsRequest())
        lane = SyncLane(stats.fast_lane, 5.0)
        local = SyncLane(stats.fast_lane, 5.0, stats.fast_lane_local)
        try:
            rows["master fast lane"] = _time(
                lambda: lane.call("BatchLookup", request), args.calls, args.rounds
            )
            rows["master fast lane, unix"] = _time(
                lambda: local.call("BatchLookup", request), args.calls, args.rounds
            )
        finally:
            lane.close()
            local.close()
    finally:
        master.terminate()
        master.wait(10)
    ratio = rows["master fast lane"] / rows["master gRPC"]
    if args.json:
        print(json.dumps({"bench": "rpc_floor", "us_per_call": rows, "lane_x_grpc": ratio}))
        return 0
    for name, us in rows.items():
        print(f"{name:<22} {us:>7.0f} us/call")
    print(f"fast lane / gRPC: {ratio:.2f}x the time per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
