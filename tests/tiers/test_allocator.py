"""OffsetAllocator: exact offsets, coalescing, allocate_at, errors, and a model check."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvstore.errors import BadRequestError
from kvstore.tiers.allocator import AllocatorStats, OffsetAllocator


def test_sequential_offsets_are_aligned_and_exact() -> None:
    alloc = OffsetAllocator(1024, alignment=64)
    assert [alloc.allocate(n) for n in (1, 100, 64, 65)] == [0, 64, 192, 256]
    assert [alloc.size_of(o) for o in (0, 64, 192, 256)] == [64, 128, 64, 128]
    assert alloc.used == 384
    assert alloc.stats() == AllocatorStats(
        capacity=1024,
        used=384,
        free=640,
        largest_free=640,
        free_ranges=1,
        allocations=4,
        fragmentation=0.0,
    )
    alloc.check_integrity()


def test_free_coalesces_both_neighbours() -> None:
    alloc = OffsetAllocator(512, alignment=64)
    a, b, c, d = (alloc.allocate(64) for _ in range(4))
    assert (a, b, c, d) == (0, 64, 128, 192)
    alloc.free(a)
    alloc.free(c)
    assert alloc.free_ranges() == [(0, 64), (128, 64), (256, 256)]
    assert alloc.stats().fragmentation == pytest.approx(1 - 256 / 384)
    alloc.free(b)  # joins a and c
    assert alloc.free_ranges() == [(0, 192), (256, 256)]
    alloc.free(d)  # joins everything
    assert alloc.free_ranges() == [(0, 512)]
    assert alloc.stats().fragmentation == 0.0
    alloc.check_integrity()


def test_reuses_a_freed_hole_that_fits() -> None:
    alloc = OffsetAllocator(1024, alignment=64)
    first = [alloc.allocate(128) for _ in range(8)]
    assert first == list(range(0, 1024, 128))
    assert alloc.allocate(1) is None  # full
    assert alloc.stats().fragmentation == 0.0
    alloc.free(384)
    assert alloc.allocate(192) is None  # hole of 128 is too small
    assert alloc.allocate(100) == 384
    alloc.check_integrity()


def test_finds_a_fitting_range_inside_a_coarse_class() -> None:
    # 1000 and 1010 units share a size class; the O(1) search skips it, the
    # fallback scan must still find the 1010-unit range for a 1005-unit request.
    alloc = OffsetAllocator(2100, alignment=1)
    left = alloc.allocate(1000)
    sep = alloc.allocate(1)
    right = alloc.allocate(1010)
    tail = alloc.allocate(89)
    assert (left, sep, right, tail) == (0, 1000, 1001, 2011)
    alloc.free(left)
    alloc.free(right)
    assert alloc.allocate(1005) == 1001
    assert alloc.allocate(1011) is None
    alloc.check_integrity()


def test_allocate_at_claims_exact_ranges() -> None:
    alloc = OffsetAllocator(4096, alignment=512)
    alloc.allocate_at(1024, 600)  # rounds to 1024
    alloc.allocate_at(0, 512)
    assert alloc.free_ranges() == [(512, 512), (2048, 2048)]
    assert alloc.size_of(1024) == 1024
    for offset, size in ((1536, 512), (512, 1024), (3584, 1024), (100, 512), (-512, 512)):
        with pytest.raises(BadRequestError):
            alloc.allocate_at(offset, size)
    alloc.check_integrity()
    assert alloc.allocate(2048) == 2048
    alloc.free(1024)
    assert alloc.free_ranges() == [(512, 1536)]
    alloc.check_integrity()


def test_claim_free_claims_only_the_free_parts_of_a_range() -> None:
    alloc = OffsetAllocator(4096, alignment=512)
    alloc.allocate_at(1024, 512)
    alloc.allocate_at(2560, 512)
    assert alloc.claim_free(512, 3072) == [(512, 512), (1536, 1024), (3072, 512)]
    assert alloc.free_ranges() == [(0, 512), (3584, 512)]  # outside the range: left free
    assert alloc.size_of(1536) == 1024  # each part is an allocation of its own
    assert alloc.claim_free(1024, 1024) == []  # nothing free there: nothing claimed
    alloc.check_integrity()
    with pytest.raises(BadRequestError):
        alloc.claim_free(0, 0)


@pytest.mark.parametrize("track", [True, False])
def test_split_recuts_an_allocation_in_place(track: bool) -> None:
    a = OffsetAllocator(4096, 64, track=track)
    assert a.allocate(1024) == 0
    free = a.free_ranges()
    a.split(0, 1024, [(0, 256), (256, 64), (320, 704)])
    assert a.free_ranges() == free and a.used == 1024  # no free range changed
    a.check_integrity(None if track else [(0, 256), (256, 64), (320, 704)])
    for bad in ([(0, 256), (320, 704)], [(0, 512)], [(0, 1000), (1000, 24)]):
        with pytest.raises(BadRequestError):  # a gap, too short, unaligned
            a.split(0, 256 if bad == [(0, 512)] else 1024, bad)
    a.free(256, 64)  # each piece is an allocation of its own now
    a.check_integrity(None if track else [(0, 256), (320, 704)])
    if track:
        with pytest.raises(BadRequestError):  # no such allocation
            a.split(0, 1024, [(0, 512), (512, 512)])


def test_ascending_allocate_at_rebuild() -> None:
    alloc = OffsetAllocator(64 * 1000, alignment=64)
    for i in range(0, 1000, 2):
        alloc.allocate_at(i * 64, 64)
    stats = alloc.stats()
    assert (stats.allocations, stats.free_ranges, stats.largest_free) == (500, 500, 64)
    alloc.check_integrity()


@pytest.mark.parametrize("bad", [0, -64, 1.5, "64", None, True])
def test_bad_sizes_raise(bad: object) -> None:
    alloc = OffsetAllocator(1024)
    with pytest.raises(BadRequestError):
        alloc.allocate(bad)  # type: ignore[arg-type]
    alloc.check_integrity()


def test_too_large_returns_none() -> None:
    alloc = OffsetAllocator(1024)
    assert alloc.allocate(1025) is None
    assert alloc.allocate(1024) == 0
    assert alloc.stats().largest_free == 0


def test_double_and_bad_free_raise() -> None:
    alloc = OffsetAllocator(1024)
    offset = alloc.allocate(10)
    assert offset == 0
    alloc.free(offset)
    for bad in (0, 64, "0", None):
        with pytest.raises(BadRequestError):
            alloc.free(bad)  # type: ignore[arg-type]
    with pytest.raises(BadRequestError):
        alloc.size_of(0)
    alloc.check_integrity()


@pytest.mark.parametrize(("capacity", "alignment"), [(0, 64), (100, 64), (1024, 48), (1024, 0)])
def test_bad_construction(capacity: int, alignment: int) -> None:
    with pytest.raises(BadRequestError):
        OffsetAllocator(capacity, alignment)


def test_check_integrity_detects_corruption() -> None:
    alloc = OffsetAllocator(1024)
    alloc.allocate(64)
    alloc._used += 64  # simulate a bookkeeping bug
    with pytest.raises(AssertionError, match="used counter"):
        alloc.check_integrity()


class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate/free/allocate_at against a byte-set model."""

    CAPACITY = 64 * 256

    @initialize()
    def setup(self) -> None:
        self.alloc = OffsetAllocator(self.CAPACITY, alignment=64)
        self.live: dict[int, int] = {}

    def _model_largest_free(self) -> int:
        best, cursor = 0, 0
        for offset, size in sorted(self.live.items()):
            best, cursor = max(best, offset - cursor), offset + size
        return max(best, self.CAPACITY - cursor)

    @rule(size=st.integers(1, 64 * 40))
    def allocate(self, size: int) -> None:
        aligned = -(-size // 64) * 64
        fits = self._model_largest_free() >= aligned
        offset = self.alloc.allocate(size)
        assert (offset is not None) == fits
        if offset is not None:
            assert offset % 64 == 0
            assert all(offset + aligned <= o or o + s <= offset for o, s in self.live.items())
            self.live[offset] = aligned

    @rule(slot=st.integers(0, 255), units=st.integers(1, 8))
    def allocate_at(self, slot: int, units: int) -> None:
        offset, size = slot * 64, units * 64
        clash = offset + size > self.CAPACITY or any(
            not (offset + size <= o or o + s <= offset) for o, s in self.live.items()
        )
        if clash:
            with pytest.raises(BadRequestError):
                self.alloc.allocate_at(offset, size)
        else:
            self.alloc.allocate_at(offset, size)
            self.live[offset] = size

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from(sorted(self.live)))
        assert self.alloc.size_of(offset) == self.live.pop(offset)
        self.alloc.free(offset)
        with pytest.raises(BadRequestError):
            self.alloc.free(offset)

    @invariant()
    def consistent(self) -> None:
        self.alloc.check_integrity()
        stats = self.alloc.stats()
        assert stats.used == sum(self.live.values())
        assert stats.allocations == len(self.live)
        assert stats.largest_free == self._model_largest_free()


AllocatorMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
TestAllocatorMachine = AllocatorMachine.TestCase


# ---- batched allocation and the untracked mode (the master's allocators) -----------


def _twin_histories(ops: list[tuple[str, int]], track: bool) -> tuple[OffsetAllocator, list[int]]:
    """Replay allocate/free ops on a fresh allocator; the live offsets by age."""
    alloc = OffsetAllocator(1 << 16, alignment=64, track=track)
    live: list[tuple[int, int]] = []
    for op, n in ops:
        if op == "alloc":
            off = alloc.allocate(n)
            if off is not None:
                live.append((off, n))
        elif live:
            off, size = live.pop(n % len(live))
            alloc.free(off, size)
    return alloc, [o for o, _ in live]


_OPS = st.lists(
    st.tuples(st.sampled_from(["alloc", "alloc", "free"]), st.integers(1, 4000)), max_size=60
)


@pytest.mark.parametrize("track", [True, False])
@settings(max_examples=150, deadline=None)
@given(ops=_OPS, size=st.integers(1, 3000), count=st.integers(0, 80))
def test_allocate_many_equals_sequential_allocates(
    track: bool, ops: list[tuple[str, int]], size: int, count: int
) -> None:
    one, _ = _twin_histories(ops, track)
    many, _ = _twin_histories(ops, track)
    want = []
    for _ in range(count):
        off = one.allocate(size)
        if off is None:
            break
        want.append(off)
    runs = many.allocate_many(size, count)
    got = [start + i * many.aligned(size) for start, n in runs for i in range(n)]
    assert got == want
    assert many.free_ranges() == one.free_ranges() and many.used == one.used
    assert many.stats().allocations == one.stats().allocations


def test_allocate_many_carves_runs() -> None:
    alloc = OffsetAllocator(64 * 100, alignment=64)
    assert alloc.allocate_many(64, 30) == [(0, 30)]
    assert alloc.allocate_many(100, 40) == [(30 * 64, 35)]  # 35 of 128 fit in the 70 left
    assert alloc.allocate_many(64, 5) == [] and alloc.used == alloc.capacity
    assert alloc.size_of(64 * 29) == 64 and alloc.stats().allocations == 65
    alloc.check_integrity()


def test_untracked_allocator_needs_sizes_and_the_owners_ranges() -> None:
    alloc = OffsetAllocator(1024, alignment=64, track=False)
    a, b = alloc.allocate(100), alloc.allocate(64)
    assert (a, b, alloc.used, alloc.tracked) == (0, 128, 192, False)
    alloc.check_integrity([(a, 100), (b, 64)])
    alloc.check_integrity()  # the free side alone
    with pytest.raises(AssertionError):
        alloc.check_integrity([(a, 100)])
    with pytest.raises(BadRequestError):
        alloc.free(a)  # no size
    with pytest.raises(BadRequestError):
        alloc.size_of(a)
    alloc.free(a, 100)
    with pytest.raises(BadRequestError):
        alloc.free(a, 100)  # double free: a free range starts there
    alloc.free(b, 64)
    assert alloc.free_ranges() == [(0, 1024)] and alloc.used == 0
    alloc.check_integrity([])


def test_tracked_free_checks_a_given_size() -> None:
    alloc = OffsetAllocator(1024, alignment=64)
    off = alloc.allocate(100)
    with pytest.raises(BadRequestError):
        alloc.free(off, 300)
    alloc.free(off, 128)
    alloc.check_integrity()
