"""The client's location cache: where a key's bytes were, so a repeated get needs no
master round trip.

An entry holds what a leased lookup said: the object's size, its checksum and its
memory-tier replicas. It lives no longer than the read lease that lookup took (and at
most `ttl_s`), so a get answered from the cache happens inside a lease this client
holds: the object cannot be evicted, and only a forced remove can take it away. Each
cached read is still checked: the bytes copied must match the checksum, or the
entry is dropped and the key goes through a normal leased lookup (counted as stale):
a forced remove whose space was reused, a node that moved, a failed read. So a cached
read never returns wrong or torn bytes. SSD replicas are never cached (their reads
count towards promotion in the master, which a cached read would skip); a key read
often is looked up again (leased, LRU-touched) once per lease or `ttl_s`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvstore.types import Location, Tier

LEASE_MARGIN = 0.8  # an entry outlives at most this fraction of its lease


@dataclass(frozen=True, slots=True)
class Cached:
    size: int
    checksum: int
    replicas: tuple[Location, ...]
    expires: float


class LocationCache:
    """Bounded LRU of key -> Cached, expired entries swept; thread-safe. `capacity` 0 = off."""

    def __init__(
        self, capacity: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: OrderedDict[str, Cached] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.stale = 0  # cached reads that failed their check and went to a lookup

    def get(self, key: str) -> Cached | None:
        """A fresh entry for `key`, or None."""
        if not self.capacity:
            return None
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry.expires <= self.clock():
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return entry

    def put(
        self, key: str, size: int, checksum: int, replicas: Sequence[Location], lease_s: float
    ) -> None:
        """Remember where `key` is for the `lease_s` a lookup leased it (only with a
        checksum, only its memory replicas)."""
        memory = tuple(r for r in replicas if r.tier != Tier.SSD)
        if not self.capacity or not checksum or not memory or lease_s <= 0:
            return
        # A little short of the lease: the master's clock started it before our reply came.
        life = min(self.ttl_s, lease_s * LEASE_MARGIN)
        now = self.clock()
        entry = Cached(size, checksum, memory, now + life)
        with self._lock:
            entries = self._entries
            entries[key] = entry
            entries.move_to_end(key)
            while len(entries) > self.capacity:
                entries.popitem(last=False)
            # Expired entries can serve nothing, and `get` drops one only when its own key
            # is asked for: sweep them from the least recently used end. Once the oldest
            # entry is unexpired, every entry was put or touched within `ttl_s`, so the
            # cache holds what the last `ttl_s` of lookups touched, not up to `capacity`
            # dead ones (~0.6 KiB each: a full 16,384 is ~10 MiB a client, bench/soak.py).
            while entries and next(iter(entries.values())).expires <= now:
                entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def drop(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)
