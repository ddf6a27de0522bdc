"""Fixtures: real server processes (python -m kvstore.transfer.serve) on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from kvstore.errors import TransferError
from kvstore.transfer.base import SegmentDescriptor
from kvstore.transfer.serve import read_descriptor


@dataclass
class ServerProcess:
    """A serving process and the descriptor of the segment it exposes."""

    proc: subprocess.Popen[bytes]
    desc: SegmentDescriptor

    def stop(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _start(size: int, seed: int | None, nixl: bool) -> ServerProcess:
    name = f"kvt-test-{uuid.uuid4().hex[:12]}"
    cmd = [sys.executable, "-m", "kvstore.transfer.serve", "--name", name, "--size", str(size)]
    cmd += ["--seed", str(seed)] if seed is not None else []
    cmd += ["--nixl"] if nixl else []
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        desc = read_descriptor(proc.stdout)  # printed once the server is ready
    except TransferError:
        proc.kill()
        raise
    return ServerProcess(proc, desc)


@pytest.fixture
def serve() -> Iterator[Callable[..., ServerProcess]]:
    """Start server processes: serve(size, seed=None, nixl=False); all stopped at
    teardown (their segments are anonymous: the kernel frees them, SIGKILL included)."""
    started: list[ServerProcess] = []

    def start(size: int, seed: int | None = None, nixl: bool = False) -> ServerProcess:
        server = _start(size, seed, nixl)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
