"""Engines killed at their tests' end leave their POSIX shared memory behind: vLLM's
message queues are `multiprocessing.shared_memory` segments (/dev/shm/psm_*), and its
multiprocessing locks named semaphores (/dev/shm/sem.mp-*), that only a clean shutdown
unlinks, and `engines.kill_group` SIGKILLs each engine's session so no EngineCore or
worker outlives its test. Each test here unlinks those that appeared while it ran and
that no live process still maps."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SHM = Path("/dev/shm")


def _segments() -> set[str]:
    if not SHM.is_dir():
        return set()
    return {p.name for pattern in ("psm_*", "sem.mp-*") for p in SHM.glob(pattern)}


def _mapped() -> set[str]:
    """Names of /dev/shm files some live process maps or holds open."""
    names: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in (proc / "maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    names.add(line.rsplit("/", 1)[-1].split()[0])
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("/dev/shm/"):
                        names.add(target.rsplit("/", 1)[-1].split()[0])
    return names


@pytest.fixture(autouse=True)
def _reap_engine_shm() -> Iterator[None]:
    before = _segments()
    yield
    new = _segments() - before
    # A SIGKILLed engine's workers may still be exiting (unmapping) when its test ends:
    # wait, bounded, until nothing maps what appeared (a CI run left two 160-240 MiB
    # psm_ segments behind when this looked only once).
    deadline = time.monotonic() + 20
    while new:
        busy = new & _mapped()
        for name in new - busy:
            with contextlib.suppress(FileNotFoundError):
                (SHM / name).unlink()
        new = busy
        if not new or time.monotonic() > deadline:
            break
        time.sleep(0.1)
