"""A heap-based discrete-event loop: callbacks run in (time, schedule order).

Ties at equal times run in the order they were scheduled, so a simulation is deterministic.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable

from kvstore.errors import BadRequestError

Callback = Callable[[], None]


class EventLoop:
    """Simulated clock plus a priority queue of pending callbacks."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callback]] = []
        self._seq = itertools.count()
        self.processed = 0

    def at(self, when: float, fn: Callback) -> None:
        """Run `fn` at absolute time `when` (not before now)."""
        if not math.isfinite(when) or when < self.now:
            raise BadRequestError(f"cannot schedule at {when} (now {self.now})")
        heapq.heappush(self._heap, (when, next(self._seq), fn))

    def after(self, delay: float, fn: Callback) -> None:
        """Run `fn` `delay` seconds from now."""
        if not delay >= 0:
            raise BadRequestError(f"delay must be >= 0, got {delay}")
        self.at(self.now + delay, fn)

    def __len__(self) -> int:
        return len(self._heap)

    def run(self, until: float = math.inf, max_events: int = 50_000_000) -> int:
        """Run events with time <= until; return how many ran. Bounded by `max_events`."""
        ran = 0
        while self._heap and self._heap[0][0] <= until:
            if ran >= max_events:
                raise RuntimeError(f"event loop ran {max_events} events without finishing")
            when, _, fn = heapq.heappop(self._heap)
            self.now = when
            fn()
            ran += 1
        self.processed += ran
        return ran
