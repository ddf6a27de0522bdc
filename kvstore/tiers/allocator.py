"""O(1) offset allocator for variable-size objects (TLSF-style).

Hands out aligned byte ranges of one linear buffer (a shared-memory segment, a
slab file). Free ranges live in segregated size classes: a first level by the
power of two of the size and `SL_COUNT` linear subdivisions inside it, each
class non-empty iff its bit is set in two bitmaps, so finding a fitting class is
a couple of bit tricks. Freed ranges coalesce with free neighbours at once, so
no two free ranges are ever adjacent.

`allocate` first looks in a class whose every range fits (O(1)); only if that
fails does it scan the request's own class for a range that happens to fit, so
it returns None exactly when no free range is large enough.

`allocate_many(size, count)` hands out the same offsets as `count` calls of
`allocate(size)`, carving runs of consecutive ranges out of one free range with
one unlink and one re-insert per run instead of one per range.

With `track=False` the allocator keeps no record per allocation (the owner
already has each range's offset and length: the master's object table does):
`free` then takes the size, and `check_integrity` the owner's list of ranges.
Memory is then O(free ranges), not O(allocations).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.errors import BadRequestError

SL_LOG = 4
SL_COUNT = 1 << SL_LOG


@dataclass(frozen=True, slots=True)
class AllocatorStats:
    """A snapshot of an allocator's occupancy."""

    capacity: int
    used: int
    free: int
    largest_free: int
    free_ranges: int
    allocations: int
    fragmentation: float  # 1 - largest_free / free: 0 when free space is one range or none


def _class_of(units: int) -> tuple[int, int]:
    """The (first, second) level class holding a free range of `units` units."""
    if units < SL_COUNT:
        return 0, units
    bits = units.bit_length()
    return bits - SL_LOG, (units >> (bits - 1 - SL_LOG)) - SL_COUNT


def _fitting_class(units: int) -> tuple[int, int]:
    """The lowest class whose every range holds at least `units` units."""
    if units >= SL_COUNT:
        units += (1 << (units.bit_length() - 1 - SL_LOG)) - 1
    return _class_of(units)


def _lowest_bit(mask: int) -> int:
    return (mask & -mask).bit_length() - 1


class OffsetAllocator:
    """Aligned ranges of [0, capacity): O(1) allocate and free, coalescing frees.

    Sizes are rounded up to `alignment` (a power of two); `capacity` must be a
    positive multiple of it. Not thread-safe: the owning tier holds the lock.
    """

    def __init__(self, capacity: int, alignment: int = 64, track: bool = True) -> None:
        if not _is_int(alignment) or alignment <= 0 or alignment & (alignment - 1):
            raise BadRequestError(f"alignment must be a power of two, got {alignment!r}")
        if not _is_int(capacity) or capacity <= 0 or capacity % alignment:
            raise BadRequestError(
                f"capacity must be a positive multiple of {alignment}, got {capacity!r}"
            )
        self._capacity = capacity
        self._alignment = alignment
        self._shift = alignment.bit_length() - 1
        fl_count = (capacity >> self._shift).bit_length() + 1
        self._bins: list[dict[int, int]] = [{} for _ in range(fl_count * SL_COUNT)]
        self._fl_bitmap = 0
        self._sl_bitmaps = [0] * fl_count
        self._free_by_start: dict[int, int] = {}  # offset -> size of each free range
        self._free_by_end: dict[int, int] = {}  # end -> offset of each free range
        # offset -> size of each allocation; None when the owner keeps them (track=False)
        self._allocated: dict[int, int] | None = {} if track else None
        self._count = 0  # allocations live
        self._used = 0
        self._insert_free(0, capacity)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def alignment(self) -> int:
        return self._alignment

    @property
    def used(self) -> int:
        return self._used

    @property
    def tracked(self) -> bool:
        """Whether the allocator records each allocation (else the owner does)."""
        return self._allocated is not None

    def aligned(self, size: int) -> int:
        """`size` rounded up to the alignment: what an allocation of it takes."""
        return (size + self._alignment - 1) & -self._alignment

    def allocate(self, size: int) -> int | None:
        """Claim `size` bytes (rounded up); the offset, or None if no free range fits."""
        size = self._check_size(size)
        if size > self._capacity:
            return None
        found = self._take_free(size)
        if found is None:
            return None
        offset, free_size = found
        if free_size > size:
            self._insert_free(offset + size, free_size - size)
        self._claimed(offset, size, 1)
        return offset

    def allocate_many(self, size: int, count: int) -> list[tuple[int, int]]:
        """Claim up to `count` ranges of `size` bytes: the offsets `count` calls of
        `allocate(size)` would return, as runs (first offset, ranges); each run's ranges
        are consecutive, `aligned(size)` apart. Fewer than `count` when space runs out.

        A run continues while the rest of the free range stays in a class every one
        of whose ranges fits: `allocate` would pick exactly that rest next (it is then
        the newest range of the lowest fitting non-empty class)."""
        size = self._check_size(size)
        if not _is_int(count) or count < 0:
            raise BadRequestError(f"count must be a non-negative int, got {count!r}")
        runs: list[tuple[int, int]] = []
        floor = self._fitting_floor(size)
        left = count
        while left and size <= self._capacity:
            found = self._take_free(size)
            if found is None:
                break
            offset, free_size = found
            n = 1 if free_size < floor else 1 + (free_size - floor) // size
            n = min(n, left, free_size // size)
            taken = n * size
            if free_size > taken:
                self._insert_free(offset + taken, free_size - taken)
            self._claimed(offset, size, n)
            runs.append((offset, n))
            left -= n
        return runs

    def allocate_at(self, offset: int, size: int) -> None:
        """Claim exactly [offset, offset + size) (rebuilding from an on-disk index).

        O(1) when the range starts a free range or when ranges are claimed in
        ascending order; otherwise O(free ranges).
        """
        size = self._check_size(size)
        if not _is_int(offset) or offset < 0 or offset % self._alignment:
            raise BadRequestError(f"offset must be a non-negative aligned int, got {offset!r}")
        if offset + size > self._capacity:
            raise BadRequestError(f"range [{offset}, {offset + size}) is out of capacity")
        start = self._free_range_containing(offset)
        if start is None or start + self._free_by_start[start] < offset + size:
            raise BadRequestError(f"range [{offset}, {offset + size}) overlaps an allocation")
        free_size = self._free_by_start[start]
        self._remove_free(start, free_size)
        if start < offset:
            self._insert_free(start, offset - start)
        end = start + free_size
        if offset + size < end:
            self._insert_free(offset + size, end - offset - size)
        self._claimed(offset, size, 1)

    def claim_free(self, offset: int, size: int) -> list[tuple[int, int]]:
        """Claim every free part of [offset, offset + size), each as an allocation of its
        own; their (offset, size), ascending (a master restoring a range it only partly
        knows the allocations of). O(free ranges)."""
        end = offset + self._check_size(size)
        parts = sorted(
            (max(start, offset), min(start + length, end))
            for start, length in self._free_by_start.items()
            if start < end and offset < start + length
        )
        for lo, hi in parts:
            self.allocate_at(lo, hi - lo)
        return [(lo, hi - lo) for lo, hi in parts]

    def split(self, offset: int, size: int, pieces: Sequence[tuple[int, int]]) -> None:
        """Re-cut the allocation [offset, +size) into `pieces` ((offset, aligned size),
        ascending), which must tile it exactly: no free range changes, so it costs no
        bin update (an extent's commit carves an object out of its range this way)."""
        cursor = offset
        for o, s in pieces:
            if o != cursor or s <= 0 or s % self._alignment:
                raise BadRequestError(f"pieces do not tile [{offset}, +{size}) at {cursor}")
            cursor = o + s
        if cursor != offset + size:
            raise BadRequestError(f"pieces end at {cursor}, not {offset + size}")
        if self._allocated is not None:
            if self._allocated.get(offset) != size:
                raise BadRequestError(f"no allocation of {size} bytes at {offset}")
            del self._allocated[offset]
            for o, s in pieces:
                self._allocated[o] = s
        self._count += len(pieces) - 1

    def free(self, offset: int, size: int | None = None) -> None:
        """Return an allocation; it merges with free neighbours at once. `size` (the
        requested or aligned size) is required when the allocator does not track."""
        size = self._released(offset, size)
        end = offset + size
        next_size = self._free_by_start.get(end)
        if next_size is not None:
            self._remove_free(end, next_size)
            size += next_size
        prev_start = self._free_by_end.get(offset)
        if prev_start is not None:
            prev_size = self._free_by_start[prev_start]
            self._remove_free(prev_start, prev_size)
            offset, size = prev_start, size + prev_size
        self._insert_free(offset, size)

    def size_of(self, offset: int) -> int:
        """The size of the allocation at `offset`, after alignment rounding (tracked only)."""
        allocated = self._tracking("size_of")
        size = allocated.get(offset) if _is_int(offset) else None
        if size is None:
            raise BadRequestError(f"{offset!r} is not an allocated offset")
        return size

    def is_allocated(self, offset: int) -> bool:
        return offset in self._tracking("is_allocated")

    def free_size_at(self, offset: int) -> int:
        """The size of the free range starting at `offset` (0 if none starts there)."""
        return self._free_by_start.get(offset, 0)

    def free_start_before(self, end: int) -> int | None:
        """The start of the free range ending at `end`, or None."""
        return self._free_by_end.get(end)

    def largest_free(self) -> int:
        """The size of the largest free range (0 when full)."""
        if not self._fl_bitmap:
            return 0
        fl = self._fl_bitmap.bit_length() - 1
        sl = self._sl_bitmaps[fl].bit_length() - 1
        return max(self._bins[fl * SL_COUNT + sl].values())

    def stats(self) -> AllocatorStats:
        free, largest = self._capacity - self._used, self.largest_free()
        return AllocatorStats(
            capacity=self._capacity,
            used=self._used,
            free=free,
            largest_free=largest,
            free_ranges=len(self._free_by_start),
            allocations=self._count,
            fragmentation=1.0 - largest / free if free else 0.0,
        )

    def free_ranges(self) -> list[tuple[int, int]]:
        """(offset, size) of every free range, by offset (O(n log n); for tests, tools)."""
        return sorted(self._free_by_start.items())

    def check_integrity(self, allocations: list[tuple[int, int]] | None = None) -> None:
        """Raise AssertionError unless every internal invariant holds. `allocations`:
        the owner's (offset, size) of every live allocation, required to check the
        tiling of an untracked allocator (without it only the free side is checked)."""
        if self._allocated is not None:
            allocations = list(self._allocated.items())
        if allocations is None:
            free = sum(self._free_by_start.values())
            assert free == self._capacity - self._used, f"free {free} != capacity - used"
            self._check_bins()
            return
        assert len(allocations) == self._count, f"{len(allocations)} ranges, {self._count} live"
        ranges = [(o, self.aligned(s), False) for o, s in allocations]
        ranges += [(o, s, True) for o, s in self._free_by_start.items()]
        ranges.sort()
        cursor, prev_free = 0, False
        for offset, size, is_free in ranges:
            assert offset == cursor, f"gap or overlap at {cursor}: next range starts at {offset}"
            assert size > 0 and size % self._alignment == 0, f"bad size {size} at {offset}"
            assert not (is_free and prev_free), f"adjacent free ranges at {offset}"
            cursor, prev_free = offset + size, is_free
        assert cursor == self._capacity, f"ranges end at {cursor}, capacity {self._capacity}"
        used = sum(s for _, s, is_free in ranges if not is_free)
        assert used == self._used, f"used counter {self._used} != allocated sum {used}"
        self._check_bins()

    def _check_bins(self) -> None:
        ends = {o + s: o for o, s in self._free_by_start.items()}
        assert ends == self._free_by_end, "free-by-end index disagrees with free ranges"
        binned = 0
        for index, bin_ in enumerate(self._bins):
            fl, sl = divmod(index, SL_COUNT)
            bit = bool(self._sl_bitmaps[fl] >> sl & 1)
            assert bit == bool(bin_), f"second-level bit of class ({fl}, {sl}) is {bit}"
            for offset, size in bin_.items():
                assert self._free_by_start.get(offset) == size, f"stale bin entry at {offset}"
                assert _class_of(size >> self._shift) == (fl, sl), f"{offset} in wrong class"
            binned += len(bin_)
        for fl, mask in enumerate(self._sl_bitmaps):
            assert bool(self._fl_bitmap >> fl & 1) == bool(mask), f"first-level bit {fl} wrong"
        assert binned == len(self._free_by_start), "free ranges missing from the bins"

    def _claimed(self, offset: int, size: int, n: int) -> None:
        """Account for `n` consecutive allocations of `size` (aligned) from `offset`."""
        if self._allocated is not None:
            for i in range(n):
                self._allocated[offset + i * size] = size
        self._count += n
        self._used += n * size

    def _released(self, offset: int, size: int | None) -> int:
        """Forget the allocation at `offset`; its aligned size."""
        if self._allocated is not None:
            got = self._allocated.pop(offset, None) if _is_int(offset) else None
            if got is None:
                raise BadRequestError(f"free of {offset!r}: not an allocated offset (double free?)")
            if size is not None and self.aligned(size) != got:
                self._allocated[offset] = got
                raise BadRequestError(f"free of {offset!r}: size {size}, allocated {got}")
            size = got
        else:
            if size is None:
                raise BadRequestError("free of an untracked allocator needs the size")
            size = self._check_size(size)
            bad = not _is_int(offset) or offset < 0 or offset + size > self._capacity
            # a free range starting at `offset` or ending inside: a double (or wrong) free
            if bad or offset in self._free_by_start or offset + size in self._free_by_end:
                raise BadRequestError(f"free of [{offset}, +{size}): not an allocated range")
            if size > self._used:
                raise BadRequestError(f"free of {size} bytes with {self._used} in use")
        self._count -= 1
        self._used -= size
        return size

    def _tracking(self, what: str) -> dict[int, int]:
        if self._allocated is None:
            raise BadRequestError(f"{what}: this allocator does not track allocations")
        return self._allocated

    def _fitting_floor(self, size: int) -> int:
        """The smallest range size (bytes) of the lowest class whose ranges all hold `size`."""
        fl, sl = _fitting_class(size >> self._shift)
        units = sl if fl == 0 else (SL_COUNT + sl) << (fl - 1)
        return units << self._shift

    def _check_size(self, size: int) -> int:
        if not _is_int(size) or size <= 0:
            raise BadRequestError(f"allocation size must be a positive int, got {size!r}")
        return self.aligned(size)

    def _take_free(self, size: int) -> tuple[int, int] | None:
        """Unlink and return a free range of at least `size` bytes, or None."""
        units = size >> self._shift
        fl, sl = _fitting_class(units)
        if fl < len(self._sl_bitmaps):
            mask = self._sl_bitmaps[fl] & (-1 << sl)
            if not mask:
                fl_mask = self._fl_bitmap & (-1 << (fl + 1))
                if fl_mask:
                    fl = _lowest_bit(fl_mask)
                    mask = self._sl_bitmaps[fl]
            if mask:
                return self._pop_bin(fl, _lowest_bit(mask))
        fl, sl = _class_of(units)
        for offset, free_size in self._bins[fl * SL_COUNT + sl].items():
            if free_size >= size:
                self._remove_free(offset, free_size)
                return offset, free_size
        return None

    def _pop_bin(self, fl: int, sl: int) -> tuple[int, int]:
        """Unlink the newest range of a non-empty class (popitem: amortised O(1))."""
        bin_ = self._bins[fl * SL_COUNT + sl]
        offset, size = bin_.popitem()
        if not bin_:
            self._clear_bit(fl, sl)
        del self._free_by_start[offset]
        del self._free_by_end[offset + size]
        return offset, size

    def _clear_bit(self, fl: int, sl: int) -> None:
        self._sl_bitmaps[fl] &= ~(1 << sl)
        if not self._sl_bitmaps[fl]:
            self._fl_bitmap &= ~(1 << fl)

    def _free_range_containing(self, offset: int) -> int | None:
        if offset in self._free_by_start:
            return offset
        for start, size in self._free_by_start.items():
            if start < offset < start + size:
                return start
        return None

    def _insert_free(self, offset: int, size: int) -> None:
        fl, sl = _class_of(size >> self._shift)
        self._bins[fl * SL_COUNT + sl][offset] = size
        self._sl_bitmaps[fl] |= 1 << sl
        self._fl_bitmap |= 1 << fl
        self._free_by_start[offset] = size
        self._free_by_end[offset + size] = offset

    def _remove_free(self, offset: int, size: int) -> None:
        fl, sl = _class_of(size >> self._shift)
        bin_ = self._bins[fl * SL_COUNT + sl]
        del bin_[offset]
        if not bin_:
            self._clear_bit(fl, sl)
        del self._free_by_start[offset]
        del self._free_by_end[offset + size]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
