"""The client's location cache: where a key's bytes were, so a repeated get needs no
master round trip.

An entry holds what a leased lookup said: the object's size, its checksum and its
memory-tier replicas, or its SSD replicas when it has no memory one. It lives no
longer than the read lease that lookup took (and at most `ttl_s`), so a get answered
from the cache happens inside a lease this client holds: the object cannot be evicted,
and only a forced remove can take it away. Each cached read is still checked: the bytes
copied must match the checksum, or the entry is dropped and the key goes through a
normal leased lookup (counted as stale): a forced remove whose space was reused, a node
that moved, a failed read. So a cached read never returns wrong or torn bytes.

SSD entries (`Cached.ssd`: from a leased lookup, or from the writer's own put under
its writer lease; only reads.py asks for them, `get(key, ssd=True)`): reads
of SSD replicas count towards promotion in the master (`promote_after`), so a read
served from one is not lost but noted (`served`) and reported with this client's next
lookup (`take_reads`: BatchLookupRequest.cached_keys / cached_reads), which the master
counts as that many lookup hits. And the read that would make the key due for promotion
is not served from the cache (`due`): it goes to the master, carrying the reads noted
so far, so promotion is queued on the same read as without the cache. A lookup that
finds the object moving (a promotion queued or in flight) does not cache its SSD
replicas: the next read looks it up again and finds the faster replica once it is
there. Reads noted after the due one reach the master late, with this client's next
lookup of any key, and only move hit counters and the LRU (the promotion was decided
on the due read). Reads still unreported when the client closes, or reported after
the object's last read lease ended, are not counted. Each client counts its own reads:
several clients reading one object report theirs with their own next lookups, so the
pool's count may reach `promote_after` later than with a lookup per read.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvstore.types import Location, Tier

LEASE_MARGIN = 0.8  # an entry outlives at most this fraction of its lease


@dataclass(slots=True)
class Cached:
    size: int
    checksum: int
    replicas: tuple[Location, ...]
    expires: float
    ssd: bool = False  # SSD replicas (the object had no memory one)
    reads: int = 0  # SSD: reads of it since it was cached (its lookups' included)


MAX_UNREPORTED = 4096  # keys with cached SSD reads waiting for the next lookup, at most
REPORT_BATCH = 1024  # reported with one lookup, at most


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
        self.ssd_hits = 0  # of `hits`, reads of SSD replicas
        self.promote_after = 0  # the master's, from its last lookup reply (0: none)
        self._unreported: dict[str, int] = {}  # key -> cached SSD reads not yet reported

    def get(self, key: str, ssd: bool = False) -> Cached | None:
        """A fresh entry for `key`, or None; SSD entries only when `ssd` (a reader that
        notes what it serves from one: `served`)."""
        if not self.capacity:
            return None
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry.expires <= self.clock():
                del self._entries[key]
                return None
            if entry.ssd and not ssd:
                return None
            self._entries.move_to_end(key)
            return entry

    def due(self, entry: Cached) -> bool:
        """Whether the next read of SSD entry `entry` is the one that makes its object
        due for promotion: that read goes to the master (a lookup), not to the cache."""
        return entry.ssd and 0 < self.promote_after == entry.reads + 1

    def served(self, key: str, entry: Cached) -> None:
        """A read of SSD entry `entry` of `key` was served from the cache: note it for
        the next lookup's report."""
        with self._lock:
            entry.reads += 1
            self.ssd_hits += 1
            unreported = self._unreported
            if key in unreported or len(unreported) < MAX_UNREPORTED:
                unreported[key] = unreported.get(key, 0) + 1

    def take_reads(self) -> tuple[list[str], list[int]]:
        """Up to REPORT_BATCH keys with cached SSD reads not yet reported, and how many
        of each; they count as reported (`untake` gives them back if the call fails)."""
        if not self._unreported:
            return [], []
        with self._lock:
            unreported = self._unreported
            keys = list(itertools.islice(unreported, REPORT_BATCH))
            reads = [unreported.pop(k) for k in keys]
        return keys, reads

    def untake(self, keys: Sequence[str], reads: Sequence[int]) -> None:
        """Reads `take_reads` handed out that the master never got."""
        with self._lock:
            unreported = self._unreported
            for key, n in zip(keys, reads, strict=True):
                if key in unreported or len(unreported) < MAX_UNREPORTED:
                    unreported[key] = unreported.get(key, 0) + n

    def unreported(self) -> int:
        """Cached SSD reads waiting for the next lookup."""
        with self._lock:
            return sum(self._unreported.values())

    def put(
        self, key: str, size: int, checksum: int, replicas: Sequence[Location], lease_s: float,
        ssd: bool = False, read: bool = True,
    ) -> None:  # fmt: skip
        """Remember where `key` is for the `lease_s` a lookup (or the writer's commit:
        not `read`) leased it, only with a checksum: its memory replicas, or with `ssd`
        its SSD ones if it has no memory replica. A lookup result that is not cached
        drops what was cached for `key`."""
        if not self.capacity:
            return
        memory = tuple(r for r in replicas if r.tier != Tier.SSD)
        on_ssd = ssd and not memory
        if on_ssd:
            memory = tuple(replicas)
        if not checksum or not memory or lease_s <= 0:
            self.drop([key])
            return
        # A little short of the lease: the master's clock started it before our reply came.
        life = min(self.ttl_s, lease_s * LEASE_MARGIN)
        now = self.clock()
        entry = Cached(size, checksum, memory, now + life, on_ssd, int(on_ssd and read))
        with self._lock:
            entries = self._entries
            prior = entries.get(key)
            if on_ssd and prior is not None and prior.ssd and prior.expires > now:
                entry.reads += prior.reads  # looked up again while cached: one run of reads
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
