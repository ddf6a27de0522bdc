"""A process that exposes one SharedSegment over TCP, by fd (and NIXL): tests, benches, demos.

    python -m kvstore.transfer.serve --name SEG --size BYTES [--seed N] [--nixl]
        [--tls-ca CA --tls-cert CERT --tls-key KEY]
        [--capability-key HEX --key-id N --clock-ms MS --node-id ID]

Prints the segment descriptor as one line "descriptor: <json>" on stdout, then serves until its
stdin closes (the parent exits or closes the pipe), then stops and frees it.
`--seed` fills the segment with `pattern(size, seed)`. `--tls-*` serve the TCP data
plane over TLS (kvstore.security.credentials.data_plane_server); `--capability-key`
(32 bytes, hex) checks capabilities as node `--node-id` would with that key, as if
RegisterNode had answered `--key-id` and the master's clock `--clock-ms` (read before
this process started) when it starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import IO

import numpy as np

from kvstore.errors import TransferError
from kvstore.tiers.shm import SharedSegment
from kvstore.transfer.base import SegmentDescriptor
from kvstore.transfer.tcp_server import ServerConfig, TransferServer

READY = b"descriptor: "


def read_descriptor(stream: IO[bytes], max_lines: int = 1000) -> SegmentDescriptor:
    """Read a serving process's stdout up to its descriptor line (skipping logs)."""
    for _ in range(max_lines):
        line = stream.readline()
        if not line:
            raise TransferError("server process exited before printing its descriptor")
        if line.startswith(READY):
            return SegmentDescriptor.from_bytes(line[len(READY) :])
    raise TransferError(f"no descriptor line in {max_lines} lines of server output")


def pattern(size: int, seed: int) -> np.ndarray:
    """Deterministic pseudo-random bytes, the same in every process."""
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--nixl", action="store_true", help="also publish NIXL metadata")
    parser.add_argument("--tls-ca", default="")
    parser.add_argument("--tls-cert", default="")
    parser.add_argument("--tls-key", default="")
    parser.add_argument("--capability-key", default="", help="hex secret: check capabilities")
    parser.add_argument("--key-id", type=int, default=1)
    parser.add_argument("--clock-ms", type=int, default=0)
    parser.add_argument("--node-id", default="n1")
    args = parser.parse_args(argv)
    segment = SharedSegment.create(args.name, args.size)
    if args.seed is not None:
        segment.numpy()[:] = pattern(args.size, args.seed)
    tls, keyring = None, None
    if args.tls_cert:
        from kvstore.security.config import SecurityConfig
        from kvstore.security.credentials import data_plane_server

        sec = SecurityConfig(ca_file=args.tls_ca, cert_file=args.tls_cert, key_file=args.tls_key)
        tls = data_plane_server(sec)
    if args.capability_key:
        import time

        from kvstore.security.capabilities import Keyring

        keyring = Keyring(args.node_id)
        secret = bytes.fromhex(args.capability_key)
        keyring.install(secret, args.key_id, args.clock_ms, time.monotonic())
    server = TransferServer(ServerConfig(host=args.host), tls=tls, keyring=keyring)
    server.start()
    if keyring is None:
        desc = server.expose_segment(segment)
    else:  # the fd only for a capability, as a secured node serves it
        from kvstore.tiers.shm import FdServer
        from kvstore.transfer.shm import fd_gate

        fds = FdServer(authorize=fd_gate(keyring))
        fds.start()
        desc = server.expose(segment.name, segment.buffer, shm=True, shm_socket=segment.serve(fds))
    nixl_engine = None
    if args.nixl:
        from kvstore.transfer.nixl import NixlEngine

        nixl_engine = NixlEngine()
        desc = nixl_engine.expose(args.name, segment.buffer, base=desc)
    sys.stdout.buffer.write(READY + desc.to_bytes() + b"\n")
    sys.stdout.flush()
    _silence_stdout()  # nobody reads our stdout now: library logs must not fill the pipe
    try:
        sys.stdin.read()  # serve until the parent closes our stdin
    finally:
        server.stop()
        segment.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
