"""Who on this host still holds a memfd segment: its fd or a mapping, by label.

The kernel frees a memfd when no fd and no mapping refers to it, so "no process
holds `memfd:<label>`" (label unique per test) is exactly "its memory is freed".
"""

from __future__ import annotations

import contextlib
import os


def holders(label: str) -> list[int]:
    """Pids whose open fds or mappings include the memfd labelled `label`."""
    target = f"/memfd:{label} (deleted)"
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _holds(int(entry), target):
            pids.append(int(entry))
    return pids


def _holds(pid: int, target: str) -> bool:
    with contextlib.suppress(OSError):  # gone, or not ours to read
        with open(f"/proc/{pid}/maps") as f:
            if any(line.rstrip("\n").endswith(target) for line in f):
                return True
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return True
    return False


def shm_files(prefix: str) -> list[str]:
    """Files in /dev/shm whose name starts with `prefix`."""
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
