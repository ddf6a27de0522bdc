"""Emulated hosts: Linux network namespaces on one bridge, for tests across "machines".

    with Network(["a", "b", "c"], workdir) as net:
        net.hosts["b"].address                     # "10.213.7.2"
        proc = net.spawn("b", "node", [sys.executable, "-m", "kvstore.node", ...])
        proc.reader.wait_for(b"kvstore node ", 30)  # a stdout line, within a deadline
        net.partition("b")                         # b's switch port down: its packets drop

Layout: a namespace per host, each with `lo` up and `eth0` = 10.213.7.<i>/24, the
far end of a veth pair whose other end is a port of bridge `br0` in one more
namespace, the switch. The root namespace gets no link, address or route: the
subnet exists only inside, so parallel runs cannot collide. Names are
"kvsnet-<pid>-<tag>-<host>"; namespaces left by a killed run (its pid gone) are
deleted at the next start. Processes run by `ip netns exec` with KVSTORE_HOST_ID =
their namespace, so kvstore treats them as distinct machines (TCP between them,
never shm) although they share /dev/shm. `close()` stops every process it started,
then deletes the namespaces (which deletes their links), even after a failure;
its processes also die with the test process if that is killed outright.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstore.transfer.base import HOST_ID_ENV
from tests.cluster import child_env, stop_process

PREFIX = "kvsnet"
SUBNET = "10.213.7"  # a /24 that exists only inside the namespaces
IP_TIMEOUT_S = 10.0
STOP_GRACE_S = 2.0
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child before exec: SIGKILL it when the test process dies (even by SIGKILL)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def ip(*args: str) -> None:
    """Run one `ip` command, bounded; RuntimeError with its stderr when it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, timeout=IP_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.decode().strip()}")


def list_netns() -> list[str]:
    """Names of the network namespaces `ip netns` knows."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, timeout=IP_TIMEOUT_S)
    return [line.split()[0] for line in out.stdout.decode().splitlines() if line.strip()]


def sweep_stale() -> list[str]:
    """Delete "kvsnet-<pid>-..." namespaces whose pid no longer runs; their names."""
    stale = []
    for name in list_netns():
        parts = name.split("-")
        ours = len(parts) > 2 and parts[0] == PREFIX and parts[1].isdigit()
        if ours and not Path(f"/proc/{parts[1]}").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                ip("netns", "delete", name)
                stale.append(name)
    return stale


class LineReader:
    """Lines of a child's stdout pipe, each awaited with a deadline (never blocks longer)."""

    def __init__(self, pipe: Any) -> None:
        self._fd: int = pipe.fileno()
        self._buf = b""

    def readline(self, timeout_s: float) -> bytes:
        """The next line (without "\\n"); TimeoutError after `timeout_s`, EOFError at end."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._fd], [], [], left)[0]:
                raise TimeoutError(f"no line within {timeout_s} s; got {self._buf[-300:]!r}")
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                raise EOFError(f"stdout closed; last bytes {self._buf[-300:]!r}")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def wait_for(self, prefix: bytes, timeout_s: float) -> bytes:
        """The first line starting with `prefix` within `timeout_s` (others are skipped)."""
        deadline = time.monotonic() + timeout_s
        while True:
            line = self.readline(max(0.0, deadline - time.monotonic()))
            if line.startswith(prefix):
                return line


@dataclass(frozen=True, slots=True)
class Host:
    """One emulated machine: a network namespace and its address on the switch."""

    name: str
    netns: str
    address: str

    def env(self) -> dict[str, str]:
        """A child's environment: this checkout importable, this host's kvstore host id;
        UCX (NIXL) restricted to TCP: it would see through the namespaces (cma, shm)."""
        return {**child_env(), HOST_ID_ENV: self.netns, "UCX_TLS": "tcp,self"}


@dataclass(slots=True)
class Proc:
    """A process started in a host; stdout piped (read by `reader`), stderr in `log`."""

    name: str
    host: Host
    popen: subprocess.Popen[bytes]
    reader: LineReader
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, size: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_bytes()[-size:].decode(errors="replace")
        return ""


@dataclass
class Network:
    """Hosts on one switch, as network namespaces; a context manager that always cleans up."""

    names: list[str]
    workdir: Path
    tag: str = field(default_factory=lambda: f"{PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:4]}")
    hosts: dict[str, Host] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    created: list[str] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    def create(self) -> Network:
        """Make the switch and every host, links up; raises (after cleanup) on failure."""
        sweep_stale()
        try:
            self._add_netns(self.switch)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            for i, name in enumerate(self.names, start=1):
                self._add_host(Host(name, f"{self.tag}-{name}", f"{SUBNET}.{i}"))
        except BaseException:
            self.close()
            raise
        return self

    def _add_netns(self, netns: str) -> None:
        ip("netns", "add", netns)
        self.created.append(netns)
        ip("-n", netns, "link", "set", "lo", "up")

    def _add_host(self, host: Host) -> None:
        self._add_netns(host.netns)
        port = f"p-{host.name}"
        ip(
            "-n",
            self.switch,
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "eth0",
            "netns",
            host.netns,
        )
        ip("-n", self.switch, "link", "set", port, "master", "br0")
        ip("-n", self.switch, "link", "set", port, "up")
        ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip("-n", host.netns, "link", "set", "eth0", "up")
        self.hosts[host.name] = host

    def spawn(self, host: str, name: str, args: list[str], stdin: bool = False) -> Proc:
        """Start `args` in `host` (stdin piped when asked); stderr goes to workdir/<name>.log."""
        h = self.hosts[host]
        log = self.workdir / f"{name}.log"
        with open(log, "ab") as err:
            popen = subprocess.Popen(
                ["ip", "netns", "exec", h.netns, *args],
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=err, env=h.env(), preexec_fn=die_with_parent,
            )  # fmt: skip
        proc = Proc(name, h, popen, LineReader(popen.stdout), log)
        self.procs.append(proc)
        return proc

    def partition(self, host: str) -> None:
        """Cut `host` off: its switch port goes down, packets to and from it are dropped."""
        ip("-n", self.switch, "link", "set", f"p-{host}", "down")

    def heal(self, host: str) -> None:
        ip("-n", self.switch, "link", "set", f"p-{host}", "up")

    def close(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL), then delete every namespace made."""
        for proc in reversed(self.procs):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                stop_process(proc.popen, STOP_GRACE_S)
            for pipe in (proc.popen.stdin, proc.popen.stdout):
                if pipe is not None:
                    pipe.close()
        self.procs.clear()
        for netns in reversed(self.created):
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                ip("netns", "delete", netns)
        self.created.clear()

    def __enter__(self) -> Network:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()
