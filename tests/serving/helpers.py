"""Shared helpers of the serving tests: job runners that wait on events, node
processes, and a recording / fault-injecting store."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvstore.errors import KVStoreError
from kvstore.serving.jobs import DecodeJob, DecodeTimings, JobEvent
from kvstore.serving.prefill import PrefillResult
from kvstore.serving.request import Request
from kvstore.serving.scheduler import DecodeScheduler
from kvstore.serving.store import LocalBlockStore
from tests.cluster import START_TIMEOUT_S, child_env, stop_process


@dataclass
class Collected:
    """Events of one job, in order; `started` is set at its first event, `done` at its last."""

    events: list[JobEvent] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def sink(self, event: JobEvent) -> None:
        self.events.append(event)
        self.started.set()
        if event.finish is not None or event.error is not None:
            self.done.set()

    @property
    def tokens(self) -> list[int]:
        return [e.token for e in self.events if e.token is not None]

    @property
    def timings(self) -> DecodeTimings:
        first = self.events[0].timings
        assert first is not None
        return first

    def wait(self, timeout_s: float = 30.0) -> Collected:
        assert self.done.wait(timeout_s), "job did not finish in time"
        return self


def submit(
    sched: DecodeScheduler, req: Request, pre: PrefillResult | None = None
) -> tuple[DecodeJob, Collected]:
    out = Collected()
    if pre is None:
        job = DecodeJob(req, out.sink)
    else:
        job = DecodeJob(req, out.sink, first_token=pre.first_token, handoff=pre.handoff)
    sched.submit(job)
    return job, out


class NodeProcess:
    """A serving node in its own process. `start` spawns; `address` waits for the line
    `... listening on HOST:PORT` (so several nodes can boot in parallel)."""

    def __init__(self, module: str, *args: str) -> None:
        cmd = [sys.executable, "-m", module, "--listen", "127.0.0.1:0", "--torch-threads", "1"]
        self.proc = subprocess.Popen(
            [*cmd, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
        self._address = ""

    @property
    def address(self) -> str:
        if not self._address:
            self._address = self._await_address(START_TIMEOUT_S * 2)
        return self._address

    def _await_address(self, timeout_s: float) -> str:
        """Raw reads of the pipe (a buffered readline would hide lines from select)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        buf = b""
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, 4096)
            if not chunk:  # exited
                break
            buf += chunk
            for line in buf.split(b"\n")[:-1]:
                if b" listening on " in line:
                    threading.Thread(target=_drain, args=(fd,), daemon=True).start()
                    return line.rsplit(b" ", 1)[1].strip().decode()
        self.stop()
        raise AssertionError(f"node did not start: {buf[-2000:].decode(errors='replace')}")

    def stop(self) -> None:
        stop_process(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class ServiceProcess(NodeProcess):
    """Any service module whose ready line is `... listening on HOST:PORT` (a conductor),
    started with exactly the arguments given."""

    def __init__(self, module: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
        self._address = ""


def _drain(fd: int) -> None:
    """Keep reading a node's output so a chatty node never blocks on a full pipe."""
    with contextlib.suppress(OSError):
        while os.read(fd, 65536):
            pass


def start_nodes(*specs: tuple[str, ...]) -> list[NodeProcess]:
    """Spawn every (module, *args) at once, then wait for each address."""
    nodes = [NodeProcess(*spec) for spec in specs]
    try:
        for node in nodes:
            assert node.address
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes


class RecordingStore:
    """A LocalBlockStore wrapper (fault-injecting fake) that records each batched put
    and fails the keys whose name contains `fail_marker` with `fail_with`."""

    def __init__(
        self, inner: LocalBlockStore, fail_marker: str = "", fail_with: KVStoreError | None = None
    ) -> None:
        self.inner = inner
        self.fail_marker = fail_marker
        self.fail_with = fail_with
        self.puts: list[list[str]] = []

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        return self.inner.batch_exists(keys)

    def match_prefix(self, keys: Sequence[str]) -> int:
        return self.inner.match_prefix(keys)

    def batch_get_into(
        self, keys: Sequence[str], outs: Sequence[memoryview]
    ) -> list[int | KVStoreError]:
        return self.inner.batch_get_into(keys, outs)

    def remove(self, key: str) -> bool:
        return self.inner.remove(key)

    def register(self, buffer: object) -> None:
        self.inner.register(buffer)

    def unregister(self, buffer: object) -> None:
        self.inner.unregister(buffer)

    def close(self) -> None:
        self.inner.close()

    def batch_put_from(
        self, keys: Sequence[str], buffers: Sequence[memoryview], group: str = ""
    ) -> list[KVStoreError | None]:
        self.puts.append(list(keys))
        results = self.inner.batch_put_from(keys, buffers, group)
        if self.fail_with is None:
            return results
        return [
            self.fail_with if self.fail_marker in k else r
            for k, r in zip(keys, results, strict=True)
        ]
