"""Start a local serving cluster as real processes on 127.0.0.1 free ports.

    with Launcher() as procs:
        master = procs.master()
        _, prefill, decode = procs.start_many([
            ("store-0", storage_argv(master, 256, "store-0")),
            ("prefill", serving_argv("prefill_node", model="small", master=master, cpus=(0,))),
            ("decode", serving_argv("decode_node", model="small", master=master, cpus=(1,))),
        ])

Every service prints one ready line naming its address ("... on HOST:PORT ..."); the
launcher spawns a batch of processes at once (they initialise in parallel: a random
model takes seconds), then waits for each ready line with a deadline. On exit it
sends SIGINT to every process, newest first (serving nodes before the pool they
use), then reaps them. Serving nodes pin themselves with `--cpus` / `--torch-threads`.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from kvstore.errors import UnavailableError

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}


def usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def shm_entries(contains: str = "") -> set[str]:
    """Names under /dev/shm containing `contains` (to check that a run leaves no
    segment behind: other processes on the host create and remove their own)."""
    try:
        return {n for n in os.listdir("/dev/shm") if contains in n}
    except FileNotFoundError:
        return set()


class Launcher:
    """Owns the processes it starts; closing it stops them all."""

    def __init__(self, ready_timeout_s: float = 60.0, log_dir: str | None = None) -> None:
        self.ready_timeout_s = ready_timeout_s
        self.log_dir = log_dir
        self.procs: list[tuple[str, subprocess.Popen[str]]] = []

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, name: str, argv: Sequence[str]) -> str:
        """Run `python <argv>`; return the address in its ready line."""
        return self.start_many([(name, argv)])[0]

    def start_many(self, named: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
        """Spawn every process first (they initialise in parallel), then wait for each
        ready line; return their addresses in order."""
        procs = [self._spawn(name, argv) for name, argv in named]
        return [
            _address(name, self._ready_line(name, p))
            for (name, _), p in zip(named, procs, strict=True)
        ]

    def _spawn(self, name: str, argv: Sequence[str]) -> subprocess.Popen[str]:
        stderr: int | IO[str] = subprocess.DEVNULL
        if self.log_dir is not None:
            stderr = open(os.path.join(self.log_dir, f"{name}.log"), "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, *argv], stdout=subprocess.PIPE, stderr=stderr, text=True,
            cwd=REPO, env=_env(),
        )  # fmt: skip
        if not isinstance(stderr, int):
            stderr.close()
        self.procs.append((name, proc))
        return proc

    def _ready_line(self, name: str, proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        deadline = time.monotonic() + self.ready_timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if sel.select(left):
                    line = proc.stdout.readline()
                    if not line:
                        raise UnavailableError(f"{name} exited ({proc.wait(5)}) before ready")
                    return line.strip()
        raise UnavailableError(f"{name} not ready within {self.ready_timeout_s} s")

    def pids(self) -> list[int]:
        return [p.pid for _, p in self.procs if p.poll() is None]

    def named_pids(self) -> dict[str, int]:
        """Name -> pid of every live process."""
        return {name: p.pid for name, p in self.procs if p.poll() is None}

    def master(self) -> str:
        return self.start("master", ["-m", "cli.main", "master", "--listen", "127.0.0.1:0"])

    def close(self, timeout_s: float = 15.0) -> list[str]:
        """SIGINT every process (newest first), reap; kill what hangs. Returns the names
        of processes that had to be killed or exited with an error."""
        trouble: list[str] = []
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                code = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
                code = -9
            if code not in (0, -signal.SIGINT):
                trouble.append(f"{name} (exit {code})")
            if proc.stdout is not None:
                proc.stdout.close()
        self.procs.clear()
        return trouble


def _address(name: str, line: str) -> str:
    """The HOST:PORT after "on" in a ready line."""
    words = line.split()
    if "on" not in words[:-1]:
        raise UnavailableError(f"{name}: unexpected ready line {line!r}")
    return words[words.index("on") + 1]


def storage_argv(master: str, dram_mib: float, node_id: str, *, nixl: bool = False) -> list[str]:
    """A storage node lending `dram_mib` of DRAM to the pool. Without NIXL by default:
    clients on this host reach its segment by shared memory anyway, and a NIXL agent's
    UCX progress thread spins a core while idle (measured: ~0.9 core, no traffic)."""
    return ["-m", "kvstore.node", "--master", master, "--dram-mib", str(dram_mib),
            "--node-id", node_id, "--nixl" if nixl else "--no-nixl"]  # fmt: skip


def serving_argv(
    module: str,
    *,
    model: str,
    cpus: Sequence[int] = (),
    master: str = "",
    extra: Sequence[str] = (),
) -> list[str]:
    """A prefill_node / decode_node process with batched projections and, when pinned,
    one torch thread per core."""
    argv = ["-m", module, "--model", model, "--batched", *extra]
    if master:
        argv += ["--master", master]
    if cpus:
        argv += ["--cpus", ",".join(map(str, cpus)), "--torch-threads", str(len(cpus))]
    return argv
