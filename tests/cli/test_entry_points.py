"""`python -m kvstore.master | kvstore.conductor | prefill_node | decode_node | kvstore.node`
as real processes given bad input: a port in use, a bad flag value, an unreachable
master. Each prints exactly one line on stderr, no traceback, and exits with the
`kvstore` command's documented code (2 usage, 4 unavailable; cli/errors.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.cluster import child_env

USAGE, UNAVAILABLE = 2, 4
ENTRY_POINTS = ["kvstore.master", "kvstore.conductor", "prefill_node", "decode_node"]
BAD_FLAG = {
    "kvstore.master": ["--lease-ttl-s", "soon"],
    "kvstore.conductor": ["--policy", "fastest"],
    "prefill_node": ["--num-blocks", "many"],
    "decode_node": ["--max-batch", "big"],
}


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture(scope="module")
def dead_port() -> int:
    with socket.socket() as s:  # bound and closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(module: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = child_env()
    env.pop("KVSTORE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip


def _one_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_port_in_use(module: str, busy_port: int) -> None:
    res = _run(module, ["--listen", f"127.0.0.1:{busy_port}"])
    line = _one_line(res)
    assert res.returncode == UNAVAILABLE, line
    assert "UnavailableError: cannot listen on" in line and str(busy_port) in line


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_bad_flag_value(module: str) -> None:
    res = _run(module, BAD_FLAG[module])
    line = _one_line(res)
    assert res.returncode == USAGE, line
    assert BAD_FLAG[module][1] in line


@pytest.mark.parametrize("module", ["kvstore.conductor", "prefill_node", "decode_node"])
def test_unreachable_master(module: str, dead_port: int) -> None:
    res = _run(module, ["--master", f"127.0.0.1:{dead_port}", "--master-wait-s", "1"])
    line = _one_line(res)
    assert res.returncode == UNAVAILABLE, line
    assert f"UnavailableError: master 127.0.0.1:{dead_port} unreachable after 1 s" in line


def test_storage_node_unreachable_master(dead_port: int) -> None:
    """The storage node (the master's own HA flags aside, it is the other side of this)."""
    res = _run("kvstore.node", ["--master", f"127.0.0.1:{dead_port}", "--join-timeout-s", "1"])
    line = _one_line(res)
    assert res.returncode == UNAVAILABLE and line.startswith("kvstore node: "), line
