"""A real etcd (Debian's etcd-server) on 127.0.0.1, a temp data dir, free ports.

    with Etcd(tmp_path / "etcd") as etcd:
        etcd.endpoint           # "127.0.0.1:PORT"
        etcd.restart()          # SIGTERM, then the same data dir and ports again

`find_etcd()` is None where no etcd binary is installed (tests skip, saying so).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

READY = b"ready to serve client requests"
START_TIMEOUT_S = 20.0
# What an operator running etcd for kvstore sets (measured in docs/reliability.md,
# "bench/soak.py"). etcd 3.4 keeps every raft entry since its last snapshot in memory and
# snapshots every 100,000 entries by default: at the soak's 100-200 journal txns/s that
# is 8-16 minutes of entries before the first snapshot, RssAnon growing ~13 MiB/min all
# along. With --snapshot-count 1000 it snapshots every few seconds and keeps 5,000
# (3.4's fixed catch-up entries) + 1,000 at most: RssAnon flat after ~40 s. The leader
# compacts the MVCC history itself every 30 s (HAConfig.compact_every_s); etcd's own
# periodic compaction (retention 5 s; one every 5 s) keeps bbolt's file, whose touched
# pages count in RSS, at ~6 MB where 30 s of history grew it past 8.7 MB in 3 minutes.
# kvstore reads no old revision (no watch; a takeover pages at the newest one).
TUNING = (
    "--snapshot-count", "1000",
    "--auto-compaction-mode", "periodic", "--auto-compaction-retention", "5s",
)  # fmt: skip


def find_etcd() -> str | None:
    return shutil.which("etcd") or next(
        (p for p in ("/usr/bin/etcd", "/usr/local/bin/etcd") if os.access(p, os.X_OK)), None
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Etcd:
    """One etcd member, started and stopped by the test."""

    def __init__(self, workdir: Path, binary: str | None = None) -> None:
        self.binary = binary or find_etcd() or "etcd"
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.client_port, self.peer_port = free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.workdir / "etcd.log"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> Etcd:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [
            self.binary, "--name", "kvs", "--data-dir", str(self.workdir / "data"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"kvs={peer}", "--log-outputs", "stderr", *TUNING,
        ]  # fmt: skip
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=out, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited {self.proc.returncode}: {self.tail()}")
            if READY in self.log.read_bytes()[-20000:] and self._accepts():
                return self
            time.sleep(0.05)
        raise RuntimeError(f"etcd not ready in {START_TIMEOUT_S} s: {self.tail()}")

    def _accepts(self) -> bool:
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", self.client_port), 0.2),
        ):
            return True
        return False

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        # the next start must find READY anew
        self.log.rename(self.workdir / f"etcd.{time.monotonic_ns()}.log")

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def tail(self, size: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_bytes()[-size:].decode(errors="replace")
        return ""

    def __enter__(self) -> Etcd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
