"""Consistency check of the DRAM tier's bookkeeping against its allocator."""

from __future__ import annotations

from collections.abc import Mapping

from kvstore.tiers.allocator import OffsetAllocator
from kvstore.tiers.dram_parts import DramEntry
from kvstore.types import ObjectKey


def check_tier(
    alloc: OffsetAllocator,
    objects: Mapping[ObjectKey, DramEntry],
    lru: Mapping[ObjectKey, DramEntry],
    doomed: Mapping[int, DramEntry],
    closed: bool,
) -> None:
    """Raise AssertionError unless every entry owns exactly one live allocation."""
    if closed:
        assert not (objects or lru or doomed), "a closed tier still holds objects"
        return
    alloc.check_integrity()
    committed = {key for key, entry in objects.items() if entry.committed}
    assert set(lru) == committed, "LRU keys differ from the committed keys"
    for key, entry in objects.items():
        assert entry.key == key and not entry.doomed, f"bad entry under {key!r}"
        assert entry.committed or entry.readers == 0, f"WRITING {key!r} has readers"
        assert entry.committed or lru.get(key) is None, f"WRITING {key!r} in the LRU"
        assert not entry.committed or lru[key] is entry, f"LRU holds another entry for {key!r}"
    for offset, entry in doomed.items():
        assert entry.doomed and entry.offset == offset, f"bad doomed entry at {offset}"
        assert objects.get(entry.key) is not entry, f"doomed {entry.key!r} is still visible"
    entries = [*objects.values(), *doomed.values()]
    for entry in entries:
        assert entry.readers >= 0 and entry.pins >= 0, f"negative counts on {entry.key!r}"
        assert entry.size > 0, f"empty object {entry.key!r}"
        assert alloc.is_allocated(entry.offset), f"{entry.key!r} at unallocated {entry.offset}"
        assert alloc.size_of(entry.offset) == alloc.aligned(entry.size), f"size of {entry.key!r}"
    assert len({e.offset for e in entries}) == len(entries), "two objects share an offset"
    assert alloc.stats().allocations == len(entries), "allocations leak or are missing"
