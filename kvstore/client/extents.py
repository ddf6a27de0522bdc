"""Puts inside an extent lease: one master round trip per put instead of two.

The client holds one extent (a range of a DRAM segment the master leased to it, see
kvstore.master.extents). A put that fits takes the next aligned range of it (a bump
pointer, no master call), writes its bytes there one-sided, then commits with one
CommitExtent (concurrent keys of one batch share it). A put returns only after its
commit: it is then visible and durable in the master exactly as after PutEnd.

When the extent is full a GrantExtent gets a new one, so a stream of 1 MiB puts into
32 MiB extents costs 1 + 1/32 round trips each. Threads share the extent: one grant
is in flight at a time (a put that finds the extent full while another thread is
getting the next one goes through PutStart, never a second grant that would orphan
one of them), and an extent is released only once no put is still writing into it
(the master frees its uncommitted ranges at once, and a one-sided write landing there
afterwards would overwrite whatever was placed there next): with the grant when it
is idle, else by the last put to finish in it.

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
    """This client's current extent; thread-safe bump allocation inside it."""

    def __init__(self, extent_bytes: int, max_object: int, margin_s: float) -> None:
        self.extent_bytes = extent_bytes
        self.max_object = max_object
        self.margin_s = margin_s
        self._lease: _Lease | None = None
        self._retiring: dict[int, _Lease] = {}  # replaced while puts were still in them
        self._granting = False
        self._lock = threading.Lock()
        self.grants = 0
        self.fallbacks = 0  # puts that went through PutStart after trying here

    @property
    def enabled(self) -> bool:
        return self.extent_bytes > 0

    def take(self, sizes: Sequence[int]) -> tuple[int, list[Location]] | None:
        """(extent id, a Location per size) carved from the current extent, or None."""
        with self._lock:
            lease = self._lease
            if lease is None or time.monotonic() >= lease.usable_until:
                return None
            a = lease.alignment
            cursor, locs = lease.cursor, []
            for size in sizes:
                start = -(-cursor // a) * a
                if start + size > lease.end:
                    return None
                locs.append(Location(lease.base.node_id, lease.base.tier, lease.base.segment,
                                     start, size, lease.base.capability))  # fmt: skip
                cursor = start + size
            lease.cursor = cursor
            lease.users += 1
            return lease.extent_id, locs

    def take_one(self, size: int) -> tuple[int, Location] | None:
        """`take([size])` for one object (a single put: no lists): (extent id, its
        Location), or None."""
        with self._lock:
            lease = self._lease
            if lease is None or time.monotonic() >= lease.usable_until:
                return None
            a = lease.alignment
            start = -(-lease.cursor // a) * a
            if start + size > lease.end:
                return None
            base = lease.base
            loc = Location(base.node_id, base.tier, base.segment, start, size, base.capability)
            lease.cursor = start + size
            lease.users += 1
            return lease.extent_id, loc

    def done(self, extent_id: int) -> bool:
        """A put that took a range of `extent_id` finished (committed or not); whether
        the caller must now release that extent (it was replaced, and this was the last
        put in it)."""
        with self._lock:
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
        or None if another thread is getting one now (then use PutStart)."""
        with self._lock:
            if self._granting:
                return None
            self._granting = True
            lease, self._lease = self._lease, None
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

    def install(self, reply: master_pb2.GrantExtentResponse, sent_at: float) -> None:
        base = from_pb_location(reply.location)
        until = sent_at + reply.ttl_ms / 1000 - self.margin_s
        if until <= time.monotonic():  # leases too short for our timeout: never usable
            self.extent_bytes = 0
        with self._lock:
            self._lease = _Lease(reply.extent_id, base, base.offset, reply.alignment or 1, until)
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

    def detach(self) -> int:
        """Forget the current extent; its id, for a final release (0 = none, or puts
        are still writing into it: then its lease runs out on the master)."""
        with self._lock:
            lease, self._lease = self._lease, None
            self._retiring.clear()
        return lease.extent_id if lease is not None and not lease.users and not lease.keep else 0


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
