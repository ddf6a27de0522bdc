"""Puts inside an extent lease: one master round trip per put instead of two.

The client holds one extent (a range of a DRAM segment the master leased to it, see
kvstore.master.extents), and at times the next one. A put that fits takes the next
aligned range of it (a bump pointer, no master call), writes its bytes there
one-sided, then commits with one CommitExtent (concurrent keys of one batch share it).
A put returns only after its commit: it is then visible and durable in the master
exactly as after PutEnd.

Before the extent fills, a commit also asks for the next one (CommitExtent's
`next_size`: once a put leaves less than a quarter of the extent, or twice its own
size; only for extents of several objects, `ASK_MIN_OBJECTS`): the master grants it,
in the same segment, with that commit, and the put that no longer fits moves
on to it with no round trip of its own, and releases the one it left with its own
commit (`release_extents`). So a stream of puts costs one round trip each, grants
included (a 1 MiB put into a 9 MiB extent waited on a GrantExtent every ninth put:
~450 us more). A GrantExtent of its own happens only for a client's first put, when
the next extent was refused (no room) or does not fit, or when it ran out unused.
Threads share the extent: one grant is in flight at a time (a put that finds the
extent full while another thread is getting the next one goes through PutStart, never
a second grant that would orphan one of them), and an extent is released only once no
put is still writing into it (the master frees its uncommitted ranges at once, and a
one-sided write landing there afterwards would overwrite whatever was placed there
next): with the grant or the next commit when it is idle, else by the last put to
finish in it.

The client uses an extent only while its lease has at least `timeout_s` left on the
client's own clock (the lease started on the master's clock before the grant
reply was sent, so the client's view is the earlier, safer one): a write begun in time
lands before the master could free the range. Puts that do not qualify (replicas > 1,
a tier other than DRAM, a pin, objects over `extent_max_object`) or that meet an
error here (no extent could be granted, a failed write, a lease the master no longer
knows) go through PutStart/PutEnd instead: nothing becomes visible twice, and space
the master granted but nobody committed is freed when the extent ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvstore.edge import from_pb_location
from kvstore.types import Location, Tier
from kvstore.v1 import master_pb2

# A commit asks for the next extent only when its extent holds at least this many of
# its objects: there, reserving the next range early costs a fraction of what the client
# holds already, and saves a round trip every few puts. An extent of an object or two
# (a small segment: at most a 16th of it is leased) is left as before, replaced by the
# put that needs a new one, so that where the data goes, and when a small tier passes
# its watermark and offloads, is the master's choice at that put.
ASK_MIN_OBJECTS = 4


@dataclass(slots=True)
class _Lease:
    extent_id: int
    base: Location  # the whole range
    cursor: int  # next free offset (segment coordinates)
    alignment: int
    usable_until: float  # client monotonic clock
    users: int = 0  # puts that took a range and have not finished
    keep: bool = False  # abandoned: never released, its lease runs out on the master

    @property
    def end(self) -> int:
        return self.base.offset + self.base.length


class ExtentHolder:
    """This client's current extent (and the next one, granted ahead); thread-safe bump
    allocation inside it."""

    def __init__(self, extent_bytes: int, max_object: int, margin_s: float) -> None:
        self.extent_bytes = extent_bytes
        self.max_object = max_object
        self.margin_s = margin_s
        self._lease: _Lease | None = None
        self._next: _Lease | None = None  # granted ahead by a commit: where puts go next
        self._asking = 0  # the ask a put carries now (0 = none): one at a time
        self._asks = 0  # the last ask handed out
        self._released: list[int] = []  # left idle: released with the next commit
        self._retiring: dict[int, _Lease] = {}  # replaced while puts were still in them
        self._granting = False
        self._lock = threading.Lock()
        self.grants = 0  # GrantExtent calls that installed an extent
        self.ahead = 0  # extents granted ahead, with a commit
        self.fallbacks = 0  # puts that went through PutStart after trying here

    @property
    def enabled(self) -> bool:
        return self.extent_bytes > 0

    def take(self, sizes: Sequence[int]) -> tuple[int, list[Location], int] | None:
        """(extent id, a Location per size, the ask this put's commit is to carry for the
        next extent, 0 for none) carved from the current extent (or the next one, when
        the current no longer fits them), or None. An ask ends with `answered` (a commit
        carried it) or with the put's `done` (none went out)."""
        with self._lock:
            found = self._carve(sizes)
            if found is None:
                return None
            lease, starts, ask = found
            b = lease.base
            locs = [Location(b.node_id, b.tier, b.segment, start, size, b.capability)
                    for start, size in zip(starts, sizes, strict=True)]  # fmt: skip
            return lease.extent_id, locs, ask

    def take_one(self, size: int) -> tuple[int, Location, int] | None:
        """`take([size])` for one object (a single put: one Location, no list)."""
        with self._lock:
            found = self._carve((size,))
            if found is None:
                return None
            lease, (start,), ask = found
            b = lease.base
            return lease.extent_id, Location(b.node_id, b.tier, b.segment, start, size,
                                             b.capability), ask  # fmt: skip

    def _carve(self, sizes: Sequence[int]) -> tuple[_Lease, list[int], int] | None:
        """(lease, start of each size, ask) with the lock held: the ranges taken from the
        current lease, or from the next one (which then becomes the current: the old one
        is released by the last put in it, or with the next commit when none is)."""
        if not sizes:
            return None
        now = time.monotonic()
        lease, starts = self._lease, None
        if lease is not None and now < lease.usable_until:
            starts = _fit(lease, sizes)
        if lease is None or starts is None:
            lease = self._next
            if lease is None or now >= lease.usable_until:
                return None
            starts = _fit(lease, sizes)
            if starts is None:
                return None
            self._retire()
            self._lease, self._next = lease, None
        lease.cursor = starts[-1] + sizes[-1]
        lease.users += 1
        left, biggest = lease.end - lease.cursor, max(sizes)
        ask = 0
        if (
            self._next is None
            and not self._asking
            and lease.base.length >= ASK_MIN_OBJECTS * biggest
            and left < max(lease.base.length // 4, 2 * biggest)
        ):
            self._asks = self._asking = ask = self._asks + 1
        return lease, starts, ask

    def _retire(self) -> None:
        """The current lease is being replaced (lock held): the last put still in it
        releases it (`done`), else the next commit does."""
        lease = self._lease
        if lease is None:
            return
        if lease.users:
            self._retiring[lease.extent_id] = lease
        elif not lease.keep:
            self._released.append(lease.extent_id)

    def take_released(self) -> list[int]:
        """The extents left idle, for a commit to release (each handed out once)."""
        with self._lock:
            out, self._released = self._released, []
            return out

    def answered(
        self, ask: int, reply: master_pb2.CommitExtentResponse | None, sent_at: float
    ) -> None:
        """The commit that carried `ask` ended: install the extent it granted (none:
        `reply` None, the commit failed, or the master had no room); the next put may
        ask again."""
        nxt = None
        if reply is not None and reply.HasField("next"):
            nxt = self._lease_of(reply.next, sent_at)
        with self._lock:
            if self._asking == ask:
                self._asking = 0
            if nxt is not None:
                if self._next is not None:  # (cannot be: one ask at a time) never orphan one
                    self._released.append(self._next.extent_id)
                self._next = nxt
                self.ahead += 1

    def done(self, extent_id: int, ask: int = 0) -> bool:
        """A put that took a range of `extent_id` (and `ask`, from `take`) finished,
        committed or not; whether the caller must now release that extent (it was
        replaced, and this was the last put in it). An ask no commit carried (the put
        failed or fell back before its commit) ends here: the next put may ask."""
        with self._lock:
            if ask and self._asking == ask:
                self._asking = 0
            lease = self._lease
            if lease is not None and lease.extent_id == extent_id:
                lease.users -= 1
                return False
            lease = self._retiring.get(extent_id)
            if lease is None:
                return False
            lease.users -= 1
            if lease.users > 0:
                return False
            del self._retiring[extent_id]
            return not lease.keep

    def begin_grant(self) -> int | None:
        """Start getting the next extent: the id to release with the grant (0 = none),
        or None if another thread is getting one now (then use PutStart). A next extent
        granted ahead that the put did not fit goes to the releases of the next commit."""
        with self._lock:
            if self._granting:
                return None
            self._granting = True
            lease, self._lease = self._lease, None
            if self._next is not None:
                self._released.append(self._next.extent_id)
                self._next = None
            if lease is None:
                return 0
            if lease.users:  # puts still writing into it: the last one releases it
                self._retiring[lease.extent_id] = lease
                return 0
            return 0 if lease.keep else lease.extent_id

    def end_grant(self) -> None:
        """The grant begun failed: the next put may try again."""
        with self._lock:
            self._granting = False

    def _lease_of(self, reply: master_pb2.GrantExtentResponse, sent_at: float) -> _Lease:
        """The lease a grant reply gives (when the master's leases are too short for this
        client's timeout, it is never usable: no more extents for this client)."""
        base = from_pb_location(reply.location)
        until = sent_at + reply.ttl_ms / 1000 - self.margin_s
        if until <= time.monotonic():
            self.extent_bytes = 0
        return _Lease(reply.extent_id, base, base.offset, reply.alignment or 1, until)

    def install(self, reply: master_pb2.GrantExtentResponse, sent_at: float) -> None:
        lease = self._lease_of(reply, sent_at)
        with self._lock:
            # while the grant was in flight, puts may have moved on to a next extent a
            # commit brought: that one stays current, never dropped unreleased
            if self._lease is None:
                self._lease = lease
            elif self._next is None:
                self._next = lease
            else:
                self._released.append(lease.extent_id)
            self._granting = False
            self.grants += 1

    def renewed(self, extent_id: int, ttl_ms: int, sent_at: float, capability: bytes = b"") -> None:
        """The lease renewed by a commit (and, secured, the extent's fresh capability)."""
        with self._lock:
            if self._lease is not None and self._lease.extent_id == extent_id:
                self._lease.usable_until = sent_at + ttl_ms / 1000 - self.margin_s
                if capability:
                    self._lease.base = replace(self._lease.base, capability=capability)

    def current(self) -> int:
        """The id of the extent puts take ranges from now (0 = none)."""
        lease = self._lease
        return lease.extent_id if lease is not None else 0

    def abandon(self, extent_id: int) -> None:
        """Stop using an extent without ever releasing it (a write may still be landing
        in it, or the master forgot it): its lease runs out on the master."""
        with self._lock:
            lease = self._lease
            if lease is not None and lease.extent_id == extent_id:
                self._lease = None
                if lease.users:
                    lease.keep = True
                    self._retiring[extent_id] = lease
            elif extent_id in self._retiring:
                self._retiring[extent_id].keep = True

    def detach(self) -> list[int]:
        """Forget every extent; the ids to release at close (not one that puts are
        still writing into: its lease runs out on the master)."""
        with self._lock:
            lease, self._lease = self._lease, None
            nxt, self._next = self._next, None
            out, self._released = self._released, []
            self._retiring.clear()
        if lease is not None and not lease.users and not lease.keep:
            out.insert(0, lease.extent_id)
        if nxt is not None:
            out.append(nxt.extent_id)
        return out


def _fit(lease: _Lease, sizes: Sequence[int]) -> list[int] | None:
    """Where `sizes` would go, in order and aligned, from `lease`'s cursor; None when
    they do not all fit."""
    a, cursor, starts = lease.alignment, lease.cursor, []
    for size in sizes:
        start = -(-cursor // a) * a
        if start + size > lease.end:
            return None
        starts.append(start)
        cursor = start + size
    return starts


def eligible_one(holder: ExtentHolder, size: int, replicas: int, tier: Tier | None,
                 pin_ttl_s: float) -> bool:  # fmt: skip
    """`eligible` for a put of one object of `size` bytes."""
    return (
        0 < size <= holder.max_object
        and size <= holder.extent_bytes
        and replicas == 1
        and not pin_ttl_s
        and (tier is None or tier == Tier.DRAM)
    )


def eligible(holder: ExtentHolder, views: Sequence[memoryview], replicas: int,
             tier: Tier | None, pin_ttl_s: float) -> bool:  # fmt: skip
    """Whether a put batch may go into an extent."""
    if not holder.enabled or replicas != 1 or pin_ttl_s or tier not in (None, Tier.DRAM):
        return False
    sizes = [v.nbytes for v in views]
    return all(0 < s <= holder.max_object for s in sizes) and sum(sizes) <= holder.extent_bytes
