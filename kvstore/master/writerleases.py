"""Writer read leases: the client that committed an object may read it back from the
location it wrote, with no lookup, for a short while (kvstore.client.locations).

A get that follows a put (a prefill node reading back what it stored, Mooncake's
benchmark reading what it wrote) used to pay one BatchLookup only to learn what the
writer already knew. A CommitExtent that asks for it (`read_lease_ms`) is granted a
writer lease on each committed key for min(asked, `writer_lease_ttl_s`); the client
then caches the location as it caches a leased lookup's.

What the lease guarantees, and how, such that a cached read returns what a lookup
would (the linearizability check in tests/ha/jepsen.py holds with it):

- the object is not removed under the writer: another client's (non-forced) remove
  is refused while the lease lasts (NotReadyError, as a read lease refuses it); the
  writer's own remove is allowed and ends its lease;
- the key is not re-created under it: unlike a read lease, a writer lease does *not*
  hold the object against eviction or tier moves (a burst of puts into a full DRAM
  tier would otherwise find every recent object pinned). If the object leaves the
  pool otherwise than by an explicit remove (eviction, its node lost) while its
  writer lease lasts, the key is kept as a tombstone until the lease ends, and
  another client's put of that key is refused meanwhile (NotReadyError, with the
  milliseconds left): the writer's cached read then returns the bytes it wrote, the
  key's last value, or - if the space was reused - fails its checksum and falls back
  to a lookup. A move to another tier keeps the object and its bytes; the old range
  is freed and, if reused, caught by the checksum the same way.

A forced remove (admin, `remove_all`, the facade's upsert) leaves no tombstone: the
key may be put again at once, and until the writer lease ends the writer's cache may
serve the removed value (never torn or foreign bytes: the checksum), as a reader's
cache may after a forced remove of a read-leased object. A new leader
(kvstore.master.ha.hold_restored: the longest lookup or writer lease granted) and a
restarted single master (its default lease or writer lease, the longer) hold every
restored object that long. Secured masters grant none (a
cached read would need a READ capability the commit does not mint).

Cost: a dict entry per key committed in the last `writer_lease_ttl_s` (swept in
order of expiry), a dict probe per dropped object, and none on the put path unless
a tombstone is live.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from kvstore.errors import NotReadyError


class WriterLeases:
    """key -> (writer, expiry) for live writer leases, and tombstones of dropped keys."""

    def __init__(self, max_ttl_s: float) -> None:
        self.max_ttl_s = max_ttl_s
        self._live: dict[str, tuple[str, float]] = {}
        self._order: deque[tuple[float, str]] = deque()  # grants in expiry order
        self._tombs: dict[str, tuple[str, float]] = {}
        self.refused_puts = 0
        self.refused_removes = 0

    def ttl(self, asked_ms: int) -> float:
        """The lease a commit that asked for `asked_ms` gets (0 = none)."""
        return min(asked_ms / 1000, self.max_ttl_s) if asked_ms > 0 else 0.0

    def grant(self, writer: str, keys: Iterable[str], ttl_s: float, now: float) -> None:
        self.sweep(now)
        until = now + ttl_s
        live, order = self._live, self._order
        for key in keys:
            live[key] = (writer, until)
            order.append((until, key))
            self._tombs.pop(key, None)  # the writer re-created its own key

    def sweep(self, now: float, tombs: bool = False) -> None:
        """Forget leases that ended (amortized O(1) per grant) and, with `tombs` (the
        master's tick), tombstones that ended (a put that meets one drops it too)."""
        order, live = self._order, self._live
        while order and order[0][0] <= now:
            _, key = order.popleft()
            held = live.get(key)
            if held is not None and held[1] <= now:
                del live[key]
        if tombs and self._tombs:
            self._tombs = {k: v for k, v in self._tombs.items() if v[1] > now}

    def holder(self, key: str, now: float) -> str | None:
        """Who holds a live writer lease on `key`, if anyone."""
        held = self._live.get(key)
        return held[0] if held is not None and held[1] > now else None

    def check_remove(self, key: str, client_id: str, now: float) -> NotReadyError | None:
        """Refuse another client's remove of a writer-leased key (None: allowed)."""
        held = self._live.get(key)
        if held is None or held[1] <= now or held[0] == client_id:
            return None
        self.refused_removes += 1
        return NotReadyError(f"{key!r} is leased (its writer may still read it)")

    def dropped(self, key: str, now: float) -> None:
        """`key` left the pool: a tombstone while its writer lease lasts."""
        held = self._live.pop(key, None)
        if held is not None and held[1] > now:
            self._tombs[key] = held

    def released(self, key: str) -> None:
        """The writer removed its own key: its lease ends, no tombstone."""
        self._live.pop(key, None)
        self._tombs.pop(key, None)

    def end_client(self, client_id: str) -> int:
        """`client_id` closed (its cache went with it): its leases and tombstones end;
        how many. O(live leases), once per closing client."""
        mine = [k for k, (w, _) in self._live.items() if w == client_id]
        for k in mine:
            del self._live[k]
        tombs = [k for k, (w, _) in self._tombs.items() if w == client_id]
        for k in tombs:
            del self._tombs[k]
        return len(mine) + len(tombs)

    def check_put(self, client_id: str, keys: Sequence[str], now: float) -> None:
        """Refuse a put of a key whose object left the pool while another client's
        writer lease on it lasts (NotReadyError naming it; the whole batch, nothing
        changed). Costs nothing while no tombstone is live."""
        if not self._tombs:
            return
        for key in keys:
            refused = self.tombstone(key, client_id, now)
            if refused is not None:
                raise refused

    def tombstone(self, key: str, client_id: str, now: float) -> NotReadyError | None:
        """`check_put` of one key, as a per-item result (an ended tombstone is dropped)."""
        held = self._tombs.get(key)
        if held is None:
            return None
        if held[1] <= now:
            del self._tombs[key]
            return None
        if held[0] == client_id:
            return None
        self.refused_puts += 1
        ms = max(1, int((held[1] - now) * 1000))
        return NotReadyError(
            f"{key!r} was dropped while its writer may still read it: retry in {ms} ms"
        )

    def __len__(self) -> int:
        return len(self._live)

    def check_integrity(self) -> None:
        assert len(self._order) >= len(self._live), "every live lease is in the order"
        assert not set(self._tombs) & set(self._live), "a key is live and a tombstone"
