"""The prefill node's queue accounting: requests and prompt tokens waiting for the
compute thread, and prefills running on it (reported by Stats, read by a conductor).

Thread-safe: the event loop adds and drops tickets, the compute thread starts and
ends them. A ticket dropped while queued (its caller went away) is no longer
counted; one whose compute already began is counted as running until it ends.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import Enum


class _State(Enum):
    QUEUED = 0
    RUNNING = 1
    DONE = 2


@dataclass(slots=True)
class Ticket:
    tokens: int
    state: _State = _State.QUEUED


@dataclass(frozen=True, slots=True)
class QueueCounts:
    waiting: int
    waiting_tokens: int
    running: int


class PrefillQueue:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting = self._waiting_tokens = self._running = 0

    def add(self, tokens: int) -> Ticket:
        with self._lock:
            self._waiting += 1
            self._waiting_tokens += tokens
        return Ticket(tokens)

    def start(self, ticket: Ticket) -> None:
        """The compute thread took the request."""
        with self._lock:
            if ticket.state is _State.QUEUED:
                self._leave_queue(ticket)
            self._running += 1
            ticket.state = _State.RUNNING

    def end(self, ticket: Ticket) -> None:
        """The compute ended (done or failed)."""
        with self._lock:
            if ticket.state is _State.RUNNING:
                self._running -= 1
            ticket.state = _State.DONE

    def drop(self, ticket: Ticket) -> None:
        """The caller is gone: stop counting a request that never started."""
        with self._lock:
            if ticket.state is _State.QUEUED:
                self._leave_queue(ticket)
                ticket.state = _State.DONE

    def _leave_queue(self, ticket: Ticket) -> None:
        self._waiting -= 1
        self._waiting_tokens -= ticket.tokens

    def counts(self) -> QueueCounts:
        with self._lock:
            return QueueCounts(self._waiting, self._waiting_tokens, self._running)

    def check_integrity(self) -> None:
        counts = self.counts()
        if min(counts.waiting, counts.waiting_tokens, counts.running) < 0:
            raise AssertionError(f"negative queue counts: {counts}")
