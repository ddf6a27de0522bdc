"""SSD tier under faults: OS write errors, a really full filesystem, kill -9."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.errors import NoSpaceError
from kvstore.tiers.direct_io import SsdIOError

from .ssd_crash_worker import LIVE, payload
from .test_ssd import K, MiB, blob, mounted, open_tier

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("code", "error"), [(errno.ENOSPC, NoSpaceError), (errno.EIO, SsdIOError)])
def test_os_write_fault_rolls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, error: type[Exception]
) -> None:
    t = open_tier(tmp_path / "ssd", 8 * MiB)
    t.put(K("keep"), blob(MiB, 1))
    used = t.stats().used

    def failing_pwritev(fd: int, buffers: object, offset: int) -> int:
        raise OSError(code, os.strerror(code))

    with monkeypatch.context() as patch:
        patch.setattr(os, "pwritev", failing_pwritev)
        with pytest.raises(error):
            t.put(K("lost"), blob(3 * MiB, 2))
        assert t.stats().used == used and not t.exists(K("lost"))
        t.check_integrity()
    t.put(K("lost"), blob(3 * MiB, 2))
    assert t.get(K("lost")) == blob(3 * MiB, 2) and t.get(K("keep")) == blob(MiB, 1)
    t.check_integrity()
    t.close()


def test_real_enospc_on_a_full_filesystem() -> None:
    with mounted("tmpfs", "size=4m") as where:
        with pytest.raises(NoSpaceError):
            open_tier(where / "too-big", 8 * MiB)
        t = open_tier(where / "ssd", MiB)
        t.put(K("first"), blob(5000, 1))
        fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):
            for _ in range(4096):  # bounded: the mount holds 1024 pages
                os.write(fd, bytes(4096))
        with pytest.raises(NoSpaceError):  # the index's WAL cannot grow
            for i in range(10_000):
                t.put(K(f"k{i}"), b"y" * 100)
        stored = t.keys()
        t.check_integrity()
        with pytest.raises(NoSpaceError):
            t.remove(K("first"))
        t.check_integrity()
        os.close(fd)
        os.unlink(where / "filler")
        t.put(K("after"), b"after")  # the index heals once there is space
        assert t.remove(K("k0"))
        assert t.keys() == [k for k in stored if k != "k0"] + ["after"]
        t.check_integrity()
        t.close()
        t = open_tier(where / "ssd", MiB)
        assert t.keys() == [k for k in stored if k != "k0"] + ["after"]
        assert t.get(K("first")) == blob(5000, 1)
        t.check_integrity()
        t.close()


def read_lines_until(proc: subprocess.Popen[str], commits: int) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    while sum(line.startswith("C ") for line in lines) < commits:
        line = proc.stdout.readline()
        assert line, f"worker ended early: {proc.stderr.read() if proc.stderr else ''}"
        lines.append(line.strip())
    return lines


def test_kill_9_during_writes_loses_nothing_committed(tmp_path: Path) -> None:
    directory, capacity = tmp_path / "ssd", 16 * MiB
    worker = Path(__file__).with_name("ssd_crash_worker.py")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, str(worker), str(directory), str(capacity)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        lines = read_lines_until(proc, 40)
        proc.kill()
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines += [line.strip() for line in rest.splitlines(keepends=True) if line.endswith("\n")]
    committed = [line[2:] for line in lines if line.startswith("C ")]
    removed = {line[2:] for line in lines if line.startswith("R ")}
    assert proc.returncode == -9 and len(committed) >= 40
    t = open_tier(directory, capacity)
    t.check_integrity()
    extra = t.stats().extra  # data goes before its index entry: nothing half-written
    assert extra["dropped_corrupt"] == 0 and extra["dropped_invalid"] == 0
    present = set(t.keys())
    live = [key for key in committed if key not in removed]
    # The kill may land between a remove and its "R" line: that one key may be gone.
    removing = live[0] if lines[-1].startswith("C ") and len(live) > LIVE else None
    for key in live:
        assert key in present or key == removing, f"committed {key} lost"
    assert not present & removed
    next_key = f"obj-{int(committed[-1].split('-')[1]) + 1}"
    assert present - set(committed) <= {next_key}  # at most the one in flight
    for key in present:
        assert t.get(K(key)) == payload(key)
    oldest = t.keys()[0]
    pages = (capacity - t.stats().used) // 4096
    for i in range(pages):  # removed and never-indexed ranges are all free again
        t.put(K(f"page-{i}"), blob(4096, i))
    assert t.stats().used == capacity and t.stats().evictions == 0
    t.put(K("one-more"), blob(4096, -1))
    assert not t.exists(K(oldest)) and t.stats().evictions == 1
    t.check_integrity()
    t.close()
