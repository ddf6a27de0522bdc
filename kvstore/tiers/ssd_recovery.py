"""Rebuild the SSD tier's state from its index at open, and check it against the index.

The index is the only truth: a slab range is allocated iff an entry names it,
so bytes of a write that was killed before its index entry are free space.
Entries that cannot be right (undecodable, out of range, overlapping another)
are dropped as invalid; with verification on, entries whose bytes fail their
checksum are dropped as corrupt. Both drops are deleted from the index.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kvstore.errors import KVStoreError
from kvstore.tiers.allocator import OffsetAllocator
from kvstore.tiers.direct_io import AlignedBuffer
from kvstore.tiers.ssd_handles import SsdObject, SsdWriteHandle
from kvstore.tiers.ssd_index import IndexEntry, SsdIndex, checksum_of
from kvstore.types import ObjectKey, check_key

Placed = tuple[str, SsdObject]
# (offset, padded size) -> those slab bytes in a new buffer
ReadRange = Callable[[int, int], AlignedBuffer]


@dataclass(slots=True)
class RecoveryReport:
    """What open() found: surviving objects (oldest first) and what it dropped."""

    objects: list[tuple[str, SsdObject]] = field(default_factory=list)
    next_generation: int = 0
    dropped_invalid: int = 0
    dropped_corrupt: int = 0

    def counters(self) -> dict[str, float]:
        return {
            "recovered": float(len(self.objects)),
            "dropped_invalid": float(self.dropped_invalid),
            "dropped_corrupt": float(self.dropped_corrupt),
        }


def recover(
    index: SsdIndex, alloc: OffsetAllocator, read: ReadRange, verify: bool
) -> RecoveryReport:
    """Claim every indexed range in `alloc`; return the objects in LRU order."""
    report = RecoveryReport()
    placed: list[Placed] = []
    bad: list[tuple[str, IndexEntry | None]] = []
    for key, entry in index.items():
        obj = _candidate(key, entry, alloc)
        if obj is None:
            bad.append((key, entry))
        else:
            placed.append((key, obj))
    placed, overlapping = _newest_without_overlaps(placed)
    for _key, obj in placed:
        alloc.allocate_at(obj.offset, obj.padded)
    bad += [(key, obj.entry()) for key, obj in overlapping]
    report.dropped_invalid = len(bad)
    if verify:
        placed, corrupt = _verify(placed, read)
        for key, obj in corrupt:
            alloc.free(obj.offset)
            bad.append((key, obj.entry()))
        report.dropped_corrupt = len(corrupt)
    for key, entry in bad:
        index.delete(key, entry)
    placed.sort(key=lambda item: item[1].generation)
    report.objects = placed
    report.next_generation = max((obj.generation for _, obj in placed), default=0)
    return report


def _candidate(key: str, entry: IndexEntry | None, alloc: OffsetAllocator) -> SsdObject | None:
    """The object an entry names; None if it cannot be a committed object."""
    if entry is None or entry.length <= 0 or entry.offset % alloc.alignment:
        return None
    padded = alloc.aligned(entry.length)
    if entry.offset + padded > alloc.capacity:
        return None
    try:
        check_key(key)
    except KVStoreError:
        return None
    return SsdObject(entry.offset, entry.length, padded, entry.checksum, entry.generation)


def _newest_without_overlaps(placed: list[Placed]) -> tuple[list[Placed], list[Placed]]:
    """Sorted by offset, overlaps resolved for the newer generation (an entry whose
    failed write reached the WAL before its range was reused is the older one)."""
    kept: list[Placed] = []
    dropped: list[Placed] = []
    for key, obj in sorted(placed, key=lambda item: item[1].offset):
        if kept and obj.offset < kept[-1][1].offset + kept[-1][1].padded:
            if obj.generation < kept[-1][1].generation:
                dropped.append((key, obj))
                continue
            dropped.append(kept.pop())
        kept.append((key, obj))
    return kept, dropped


def _verify(placed: list[Placed], read: ReadRange) -> tuple[list[Placed], list[Placed]]:
    """Split objects into (intact, corrupt) by reading them, a few at a time."""

    def intact(item: Placed) -> bool:
        obj = item[1]
        try:
            buf = read(obj.offset, obj.padded)
        except KVStoreError:
            return False
        try:
            return checksum_of(buf.view[: obj.length]) == obj.checksum
        finally:
            buf.close()

    with ThreadPoolExecutor(4, thread_name_prefix="ssd-verify") as pool:
        flags = list(pool.map(intact, placed))
    good = [item for item, ok in zip(placed, flags, strict=True) if ok]
    corrupt = [item for item, ok in zip(placed, flags, strict=True) if not ok]
    return good, corrupt


def check_consistency(
    objects: Mapping[ObjectKey, SsdObject],
    doomed: Mapping[int, SsdObject],
    writing: Mapping[ObjectKey, SsdWriteHandle | None],
    alloc: OffsetAllocator,
    index: SsdIndex,
) -> None:
    """Raise AssertionError unless the allocator holds exactly the tier's ranges
    and the index holds exactly its committed objects."""
    alloc.check_integrity()
    ranges = [(o.offset, o.padded) for o in objects.values()]
    ranges += [(o.offset, o.padded) for o in doomed.values()]
    ranges += [(h.offset, h.padded) for h in writing.values() if h is not None]
    for offset, padded in ranges:
        got = alloc.size_of(offset)
        assert got == padded, f"slab range at {offset}: allocator has {got}, tier {padded}"
    if None not in writing.values():  # no reserve is between allocate and register
        held = sum(padded for _, padded in ranges)
        assert held == alloc.used, f"tier holds {held} bytes, allocator {alloc.used}"
    for obj in doomed.values():
        assert obj.doomed and obj.readers > 0, f"doomed object at {obj.offset} has no reader"
    on_disk = dict(index.items())
    assert set(on_disk) == set(objects), "index keys differ from committed keys"
    for key, obj in objects.items():
        want = obj.entry()
        assert on_disk[key] == want, f"index entry of {key!r} is {on_disk[key]}, not {want}"
        assert obj.readers >= 0 and obj.pins >= 0 and not obj.doomed, f"bad state of {key!r}"
