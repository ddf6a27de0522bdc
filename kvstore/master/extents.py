"""Extent leases: a client places its small puts inside a range the master granted it,
so a put costs one master round trip (the commit) instead of two (PutStart + PutEnd).

    grant  -> the master allocates one range in a memory segment for the client
              (placed like a put: the client's own node first) and leases it for
              `extent_ttl_s`;
    write  -> the client bump-allocates objects inside it and writes their bytes
              (one-sided, as for any put), with no master call;
    commit -> one call makes a batch of them visible: each becomes an ordinary
              COMPLETE object with its own allocation, carved out of the extent;
              the lease is renewed;
    end    -> released by the client, or its lease expires: the rest of the range
              (everything not committed) is freed. Nothing uncommitted is ever
              visible, so a client killed mid-write loses only its own space.

In the allocator an extent is a set of *pieces* (allocations): a commit of
[offset, offset+size) frees the piece holding it and claims back the part before,
the object and the part after, so every object is an allocation of its own (eviction,
removal and tier moves treat it like any other) and `check_integrity` holds:
objects + extents + reserved moves == allocator usage. A commit after the lease
ended fails (NotFoundError): the client falls back to PutStart, nothing was placed
twice. The core is synchronous, with the master's clock; no grpc.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvstore.errors import BadRequestError, KVStoreError, NotFoundError
from kvstore.master.model import Segment
from kvstore.types import Location


class CommitItem(NamedTuple):  # immutable, and cheaper to make than a frozen dataclass
    key: str
    offset: int
    size: int
    checksum: int = 0
    group: str = ""


def commit_items(items: Iterable[Any]) -> list[CommitItem]:
    """A CommitExtent request's items (CommitItem messages) as the core's CommitItems."""
    return [CommitItem(it.key, it.offset, it.size, it.checksum, it.group) for it in items]


# A CommitExtent request and its items, as the master's guard read them to check it
# (kvstore.security.guard), so that the servicer reads the request's fields only once.
PREPARED_COMMIT: ContextVar[tuple[object, list[CommitItem]] | None] = ContextVar(
    "commit_items", default=None
)


@dataclass(slots=True)
class Extent:
    """A leased range of one segment: its still-uncommitted pieces (offset -> size)."""

    extent_id: int
    client_id: str
    node_id: str
    segment: str
    start: int
    size: int
    expires: float
    pieces: dict[int, int] = field(default_factory=dict)

    def piece_holding(self, offset: int, size: int) -> int | None:
        """The start of the piece holding [offset, offset + size), or None."""
        for start, length in self.pieces.items():
            if start <= offset and offset + size <= start + length:
                return start
        return None


class Extents:
    """Every live extent of a pool, with the segment lookups it needs."""

    def __init__(
        self, segment_of: Callable[[str, str], Segment | None], ttl_s: float,
        journal: Callable[[str, list[Extent]], None] = lambda client_id, extents: None,
    ) -> None:  # fmt: skip
        self._segment_of = segment_of
        # told a client's live extents whenever they change (the journal keeps one record
        # per client: a grant that releases the last extent is one write, not two)
        self._journal = journal
        self.ttl_s = ttl_s
        self.live: dict[int, Extent] = {}
        self._of_client: dict[str, dict[int, Extent]] = {}
        self._next_id = 1
        self.granted = 0
        self.expired = 0

    def add(self, client_id: str, loc: Location, now: float) -> Extent:
        """Record a range just allocated at `loc` as a new extent of `client_id`."""
        ext = Extent(
            self._next_id, client_id, loc.node_id, loc.segment, loc.offset, loc.length,
            now + self.ttl_s, {loc.offset: self._held(loc)},
        )  # fmt: skip
        self._next_id += 1
        self._insert(ext)
        self.changed(client_id)
        self.granted += 1
        return ext

    def _insert(self, ext: Extent) -> None:
        self.live[ext.extent_id] = ext
        self._of_client.setdefault(ext.client_id, {})[ext.extent_id] = ext

    def _remove(self, ext: Extent) -> bool:
        """Forget `ext` (False if it was not live) and tell the journal."""
        if self.live.pop(ext.extent_id, None) is None:
            return False
        mine = self._of_client[ext.client_id]
        del mine[ext.extent_id]
        if not mine:
            del self._of_client[ext.client_id]
        self.changed(ext.client_id)
        return True

    def changed(self, client_id: str) -> None:
        """Tell the journal the live extents of `client_id` (none: its record goes)."""
        self._journal(client_id, list(self._of_client.get(client_id, {}).values()))

    def _held(self, loc: Location) -> int:
        """Bytes the allocator holds for the range at `loc` (its length, aligned up)."""
        seg = self._segment_of(loc.node_id, loc.segment)
        assert seg is not None
        return seg.allocator.aligned(loc.length)

    def owned(self, client_id: str, extent_id: int, now: float) -> Extent:
        """The live extent `extent_id` of `client_id` (NotFoundError once it ended)."""
        ext = self.live.get(extent_id)
        if ext is None or ext.client_id != client_id or ext.expires <= now:
            raise NotFoundError(f"extent {extent_id} is not leased to {client_id!r} (expired?)")
        return ext

    def carve(self, ext: Extent, item: CommitItem) -> Location | KVStoreError:
        """Turn [item.offset, +item.size) of `ext` into an allocation of its own."""
        seg = self._segment_of(ext.node_id, ext.segment)
        if seg is None:
            return NotFoundError(f"segment {ext.segment!r} of extent {ext.extent_id} is gone")
        alloc = seg.allocator
        size = -(-item.size // seg.alignment) * seg.alignment  # what an allocation takes
        if item.size <= 0 or item.offset % seg.alignment:
            return BadRequestError(f"{item.key!r}: size must be > 0 and offset aligned")
        start: int | None = item.offset  # a bump-allocated commit: the piece starts there
        if ext.pieces.get(item.offset, 0) < size:  # (pieces are disjoint: none other holds it)
            start = ext.piece_holding(item.offset, size)
        if start is None:
            return BadRequestError(
                f"{item.key!r}: [{item.offset}, +{size}) is not an uncommitted part of "
                f"extent {ext.extent_id}"
            )
        length = ext.pieces.pop(start)
        end = start + length
        after = item.offset + size
        if start == item.offset:  # a bump-allocated commit: the object, then the rest
            cut = [(start, size)]
            if end > after:
                cut.append((after, end - after))
                ext.pieces[after] = end - after
        else:
            cut = []  # the piece, re-cut in place: no free range changes
            for lo, hi in ((start, item.offset), (item.offset, after), (after, end)):
                if hi > lo:
                    cut.append((lo, hi - lo))
                    if lo != item.offset:
                        ext.pieces[lo] = hi - lo
        alloc.split(start, length, cut)
        return Location(ext.node_id, seg.tier, ext.segment, item.offset, item.size)

    def renew(self, ext: Extent, now: float) -> None:
        ext.expires = now + self.ttl_s

    def release(self, ext: Extent) -> int:
        """Free what is left of `ext`; bytes freed."""
        self._remove(ext)
        seg = self._segment_of(ext.node_id, ext.segment)
        freed = 0
        for start, length in ext.pieces.items():
            if seg is not None:
                seg.allocator.free(start, length)
            freed += length
        ext.pieces.clear()
        return freed

    def expire(self, now: float) -> int:
        """Release every extent whose lease ended; how many."""
        ended = [e for e in self.live.values() if e.expires <= now]
        for ext in ended:
            self.release(ext)
        self.expired += len(ended)
        return len(ended)

    def on_unmount(self, node_id: str, segment: str) -> None:
        """The segment went away with its allocator: forget its extents."""
        for ext in [e for e in self.live.values() if (e.node_id, e.segment) == (node_id, segment)]:
            ext.pieces.clear()
            self._remove(ext)

    def restore(
        self, extent_id: int, client_id: str, node_id: str, segment: str, start: int,
        size: int, now: float,
    ) -> Extent | None:  # fmt: skip
        """A predecessor's extent (a journal record), leased anew for `ttl_s`
        from `now`: its pieces are the parts of its range that nothing else holds
        (restored objects, later extents). None when nothing of it is left (the caller
        then re-journals the client: `changed`)."""
        self._next_id = max(self._next_id, extent_id + 1)
        seg = self._segment_of(node_id, segment)
        pieces = seg.allocator.claim_free(start, seg.allocator.aligned(size)) if seg else []
        if not pieces:
            return None
        ext = Extent(
            extent_id, client_id, node_id, segment, start, size, now + self.ttl_s, dict(pieces)
        )
        self._insert(ext)
        return ext

    def pieces(self) -> Iterator[tuple[str, str, int, int]]:
        """(node, segment, offset, size) of every uncommitted piece (integrity checks)."""
        for ext in self.live.values():
            for start, length in ext.pieces.items():
                yield ext.node_id, ext.segment, start, length

    def reserved_bytes(self) -> int:
        return sum(length for *_, length in self.pieces())
