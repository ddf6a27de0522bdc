"""Run `python -m cli.main ...` as real processes and wait for their ready line."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def kvstore_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The next stdout line of `proc`, or AssertionError after `timeout_s` or at exit."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            if sel.select(left):
                line = proc.stdout.readline()
                assert line, f"process exited ({proc.poll()}) before its ready line"
                return line.strip()
        raise AssertionError(f"no ready line within {timeout_s} s")
    finally:
        sel.close()


@contextmanager
def service(*args: str, timeout_s: float = 30.0) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start `kvstore <args>`, yield (process, ready line); SIGINT and reap on exit."""
    proc = subprocess.Popen(
        kvstore_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        cwd=REPO, env=env(),
    )  # fmt: skip
    try:
        yield proc, read_line(proc, timeout_s)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def run(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        kvstore_cmd(*args), capture_output=True, text=True, cwd=REPO, env=env(), timeout=timeout_s
    )
