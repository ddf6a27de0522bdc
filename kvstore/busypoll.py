"""Busy polling: wait for a socket by polling it for a short while before sleeping.

A put's one master round trip (kvstore.fastlane) spends more time in two wake-ups than
in the master's work: the master sleeps in epoll until the request lands, the client
sleeps in recv until the reply does, and each wake of an idle CPU costs tens of
microseconds (on a VM an idle vCPU halts, and waking it is an exit to the hypervisor).
In a stream of one-object facade puts on a 2-core VM (2026-12-04, docs/performance.md)
a 4 KiB put took 170 us p50 with both sides sleeping, ~110 us with either side
polling, ~60 us with both; a 1 MiB put 270-300 us, then 160-200 us.

So, as Linux's SO_BUSY_POLL and RDMA completion-queue polling do, a waiter polls first:

- `Spinner` + `recv_polling`: a client's call polls its socket for the reply (a
  non-blocking recv in a loop) for up to `budget_s`, then blocks as before;
- `PollingSelector`: an event loop's selector polls (epoll with a zero timeout) for up
  to `window_s` after the last event before it sleeps: a server answering a stream of
  requests catches the next one without a wake-up.

Both are bounded and adaptive, since polling spends a CPU to save latency:

- a wait polls only while the host has a CPU to spare (`spare_cpu`: fewer tasks
  running than CPUs, from /proc/loadavg, ~2 us). With a third busy thread on these 2
  cores (a pre-fault thread beside a put stream, bench/mooncake_side_by_side.py
  --placement remote) polling unconditionally made a 1 MiB put's call 389 -> 552 us:
  the poller took the core the other thread needed, and CFS favours a waking sleeper
  over a spinner, never the other way;
- every poll yields the CPU (sched_yield) to whatever else is runnable on it;
- a waiter whose polls keep missing (nothing arrives within the budget: a slow peer,
  an idle stream) stops polling for a doubling number of waits (up to `MAX_BACKOFF`)
  before it tries again.

A budget of 0 turns polling off (ClientConfig.busy_poll_us, MasterConfig.busy_poll_us);
it is off anywhere this process may use a single CPU, where a poll could only delay
the peer it waits for.
"""

from __future__ import annotations

import os
import selectors
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

MISSES_BEFORE_BACKOFF = 3  # polls in a row that found nothing, then a pause
MAX_BACKOFF = 256  # waits, at most, without polling after misses
RECHECK = 16  # polls between two looks at whether a CPU is still to spare (~30-50 us)


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


_HOST_CPUS = os.cpu_count() or 1
_loadavg = -2  # fd of /proc/loadavg, opened on first use; -1: none (not Linux)


def spare_cpu() -> bool:
    """Whether the host has an idle CPU now: its running tasks (this one included,
    /proc/loadavg's fourth field) are no more than its CPUs, so a poll takes no CPU that
    another task needs. True where that cannot be read."""
    global _loadavg
    if _loadavg == -2:
        try:
            _loadavg = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            _loadavg = -1
    if _loadavg < 0:
        return True
    try:
        running = int(os.pread(_loadavg, 128, 0).split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return True
    return running <= _HOST_CPUS


def usable(budget_s: float) -> float:
    """`budget_s`, or 0 where polling cannot help (one CPU: the peer needs it)."""
    return budget_s if budget_s > 0 and cpus() > 1 else 0.0


class Spinner:
    """When to poll, and for how long: `budget_s`, paused after misses (not thread-safe:
    one per waiter)."""

    __slots__ = ("budget_s", "hits", "missed", "misses", "pause", "skip")

    def __init__(self, budget_s: float) -> None:
        self.budget_s = usable(budget_s)
        self.misses = 0  # in a row
        self.pause = 0  # waits to skip after the next run of misses
        self.skip = 0  # waits left to skip now
        self.hits = 0  # counters (tests, stats)
        self.missed = 0

    def due(self) -> float:
        """Seconds to poll before this wait blocks (0: block now)."""
        if not self.budget_s:
            return 0.0
        if self.skip:
            self.skip -= 1
            return 0.0
        return self.budget_s if spare_cpu() else 0.0

    def hit(self) -> None:
        self.hits += 1
        self.misses = self.pause = 0

    def miss(self) -> None:
        self.missed += 1
        self.misses += 1
        if self.misses >= MISSES_BEFORE_BACKOFF:
            self.misses = 0
            self.pause = min(MAX_BACKOFF, self.pause * 2 or 1)
            self.skip = self.pause


def _poll(spinner: Spinner, end: float, attempt: Callable[[], T | None]) -> T | None:
    """`attempt()` until it returns something (a hit) or `end` passes (a miss), yielding
    the CPU between tries; None on a miss, or as soon as another task needs the CPU."""
    clock, yield_cpu = time.perf_counter, os.sched_yield
    polls = 0
    while True:
        got = attempt()
        if got is not None:
            spinner.hit()
            return got
        polls += 1
        if clock() > end:
            spinner.miss()
            return None
        if not polls % RECHECK and not spare_cpu():  # another task needs the CPU now
            return None
        yield_cpu()  # anything else runnable on this CPU goes first


def recv_polling(sock: socket.socket, nbytes: int, spinner: Spinner) -> bytes | None:
    """Up to `nbytes` from `sock` if they arrive while `spinner` says to poll; None when
    they did not (the caller then blocks in its usual recv). b"": the peer closed."""
    budget = spinner.due()
    if not budget:
        return None

    def attempt() -> bytes | None:
        try:
            return sock.recv(nbytes, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None

    return _poll(spinner, time.perf_counter() + budget, attempt)


class PollingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The default selector, polling for up to `window_s` after the last event before
    it sleeps (an asyncio loop's: `asyncio.SelectorEventLoop(PollingSelector(w))`)."""

    def __init__(self, window_s: float) -> None:
        super().__init__()
        self.spinner = Spinner(window_s)
        self._last = 0.0  # when the last select returned events

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        clock = time.perf_counter
        start = clock()
        end = self._last + self.spinner.budget_s  # the window after the last event
        if (timeout is None or timeout > 0) and start < end and self.spinner.due():
            if timeout is not None:
                end = min(end, start + timeout)
            ready = _poll(self.spinner, end, lambda: super(PollingSelector, self).select(0) or None)
            if ready is not None:
                self._last = clock()
                return ready
            if timeout is not None:
                timeout = max(0.0, timeout - (clock() - start))
        ready = super().select(timeout)
        if ready:
            self._last = clock()
        return ready
