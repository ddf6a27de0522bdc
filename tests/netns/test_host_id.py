"""KVSTORE_HOST_ID: the host identity that decides shm vs TCP (no namespaces needed)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.transfer.base import HOST_ID_ENV
from tests.cluster import child_env
from tests.netns.hosts import PREFIX, ip, list_netns, sweep_stale

PROBE = (
    "import os\n"
    "from kvstore.transfer.base import SegmentDescriptor, local_host_id\n"
    "first = local_host_id()\n"
    "os.environ['KVSTORE_HOST_ID'] = 'changed-later'\n"
    "same = SegmentDescriptor('s', 1, first).same_host\n"
    "print(first, local_host_id() == first, same)\n"
)


def host_id_of_child(value: str | None) -> list[str]:
    """A child's local_host_id() with KVSTORE_HOST_ID = `value` (None: unset), and checks."""
    env = child_env()
    env.pop(HOST_ID_ENV, None)
    if value is not None:
        env[HOST_ID_ENV] = value
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, timeout=60, check=True
    )
    return out.stdout.decode().split()


def test_override_is_the_host_id_read_once() -> None:
    assert host_id_of_child("rack7-host3") == ["rack7-host3", "True", "True"]


def test_unset_or_blank_is_hostname_and_boot_id() -> None:
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    expected = [f"{socket.gethostname()}/{boot}", "True", "True"]
    assert host_id_of_child(None) == expected
    assert host_id_of_child("  ") == expected


@pytest.mark.netns
def test_sweep_deletes_namespaces_of_dead_runs_only() -> None:
    dead_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # never a live pid
    dead, live = f"{PREFIX}-{dead_pid}-t-x", f"{PREFIX}-1-t-x"  # pid 1 always runs
    ip("netns", "add", dead)
    ip("netns", "add", live)
    try:
        assert dead in sweep_stale()
        names = list_netns()
        assert dead not in names
        assert live in names
    finally:
        for name in (dead, live):
            if name in list_netns():
                ip("netns", "delete", name)
