"""Removal of handed-off tail objects that no decode node consumed in time.

A prefill node writes a request's partial last block under a request-scoped key
and hands it off; the decode node removes it once read. When the client never
calls Decode (it crashed, or only wanted the first token), nobody else would: the
tail would sit in the pool until evicted. `TailSweeper` remembers each handed-off
tail with a deadline `ttl_s` after the handoff and removes the expired ones on
`sweep()` (the prefill node calls it before each prefill and on a timer).

A tail removed after a decode node read it is a no-op; one removed before a slow
decode node read it is a miss that the decode node's `on_missing` policy handles
(recompute by default), so the TTL should be well above the expected queue time
of a decode. The clock is injectable (tests advance it instead of sleeping).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvstore.errors import BadRequestError, KVStoreError
from kvstore.serving.store import BlockStore


@dataclass(frozen=True, slots=True)
class _Tail:
    deadline: float
    keys: tuple[str, ...]


class TailSweeper:
    """Handed-off tails in handoff order (one TTL: deadlines are in the same order)."""

    def __init__(
        self, store: BlockStore, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if ttl_s <= 0:
            raise BadRequestError(f"tail ttl_s must be > 0, got {ttl_s!r}")
        self.store = store
        self.ttl_s = ttl_s
        self.clock = clock
        self._tails: deque[_Tail] = deque()
        self._lock = threading.Lock()
        self.removed = 0  # tails this sweeper removed (not consumed in time)

    def track(self, keys: Sequence[str]) -> None:
        """A tail (its object keys) was just handed off."""
        if keys:
            with self._lock:
                self._tails.append(_Tail(self.clock() + self.ttl_s, tuple(keys)))

    def sweep(self) -> int:
        """Remove every tail past its deadline; the number of tails still in the store."""
        now = self.clock()
        expired: list[_Tail] = []
        with self._lock:
            while self._tails and self._tails[0].deadline <= now:
                expired.append(self._tails.popleft())
        found = sum(any([self._remove(key) for key in tail.keys]) for tail in expired)
        with self._lock:
            self.removed += found
        return found

    def _remove(self, key: str) -> bool:
        with contextlib.suppress(KVStoreError):
            return self.store.remove(key)
        return False

    def pending(self) -> int:
        """Tails handed off and not yet past their deadline (or not yet swept)."""
        with self._lock:
            return len(self._tails)

    def check_integrity(self) -> None:
        """Deadlines never decrease along the queue."""
        with self._lock:
            deadlines = [t.deadline for t in self._tails]
        if deadlines != sorted(deadlines):
            raise AssertionError("tail deadlines out of order")
