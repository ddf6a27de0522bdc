"""A put storm: writer threads putting fresh keys through the HA address list, each
outcome recorded with its time, for the fault tests and bench/failover.py.

    storm = PutStorm(cluster.address, writers=4).start()
    ... kill the leader at t = time.monotonic() ...
    storm.stop()
    storm.resumed_after(t), storm.lost(cluster.address), storm.untyped
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

from kvstore.client import Client
from kvstore.errors import KVStoreError


def value_of(key: str, size: int) -> bytes:
    """The bytes a storm puts under `key` (checkable after)."""
    seed = (key.encode() + b"|") * (size // (len(key) + 1) + 1)
    return seed[:size]


@dataclass
class PutStorm:
    address: str
    writers: int = 4
    value_bytes: int = 1024
    failover_s: float = 30.0
    prefix: str = "storm"
    acked: list[tuple[float, float, str]] = field(default_factory=list)  # start, end, key
    failed: list[tuple[float, str, str]] = field(default_factory=list)  # end, key, error type
    untyped: list[str] = field(default_factory=list)  # anything not a KVStoreError
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> PutStorm:
        for w in range(self.writers):
            t = threading.Thread(target=self._write, args=(w,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _write(self, w: int) -> None:
        with Client(self.address, failover_timeout_s=self.failover_s) as c:
            n = 0
            while not self._stop.is_set():
                key = f"{self.prefix}/w{w}/{n}"
                n += 1
                started = time.monotonic()
                try:
                    c.put(key, value_of(key, self.value_bytes))
                except KVStoreError as exc:
                    with self._lock:
                        self.failed.append((time.monotonic(), key, type(exc).__name__))
                except Exception as exc:
                    with self._lock:
                        self.untyped.append(repr(exc))
                else:
                    with self._lock:
                        self.acked.append((started, time.monotonic(), key))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.failover_s + 30)

    def acks_after(self, t: float) -> int:
        return sum(1 for _, end, _ in self.acked if end > t)

    def resumed_after(self, t: float) -> float | None:
        """Seconds from `t` (a kill) until the first put acknowledged after it."""
        ends = [end for _, end, _ in self.acked if end > t]
        return min(ends) - t if ends else None

    def longest_gap(self, after: float) -> float:
        """The longest time without an acknowledged put, from `after` on."""
        ends = sorted(end for _, end, _ in self.acked if end > after)
        points = [after, *ends]
        return max((b - a for a, b in itertools.pairwise(points)), default=0.0)

    def lost(self, address: str, batch: int = 500) -> list[str]:
        """Acknowledged keys that a fresh client cannot read back byte for byte."""
        keys = [key for _, _, key in self.acked]
        missing: list[str] = []
        with Client(address, failover_timeout_s=self.failover_s) as c:
            for i in range(0, len(keys), batch):
                part = keys[i : i + batch]
                for key, got in zip(part, c.batch_get(part), strict=True):
                    if got != value_of(key, self.value_bytes):
                        missing.append(key)
        return missing
