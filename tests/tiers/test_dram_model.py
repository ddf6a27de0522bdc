"""DramTier against a dict + LRU-list model, driven by Hypothesis.

Every eviction must take the least recently used unprotected objects, in order,
with the bytes the model holds; NoSpaceError must change nothing; and
check_integrity() must pass after every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvstore.errors import BadRequestError, ExistsError, NoSpaceError, NotReadyError
from kvstore.tiers.dram import DramConfig, DramReadHandle, DramTier, DramWriteHandle

KEYS = st.sampled_from([f"k{i}" for i in range(10)])
SIZES = st.integers(1, 200)


@dataclass
class Model:
    values: dict[str, bytes] = field(default_factory=dict)  # committed, LRU order
    pins: dict[str, int] = field(default_factory=dict)
    readers: dict[str, int] = field(default_factory=dict)
    lease_until: dict[str, float] = field(default_factory=dict)

    def touch(self, key: str) -> None:
        self.values[key] = self.values.pop(key)

    def protected(self, key: str, now: float) -> bool:
        busy = self.pins.get(key, 0) or self.readers.get(key, 0)
        return bool(busy) or self.lease_until.get(key, -1.0) > now

    def drop(self, key: str) -> None:
        del self.values[key]
        for table in (self.pins, self.readers, self.lease_until):
            table.pop(key, None)


class DramMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        config = DramConfig(8 * 64, high_watermark=0.9, low_watermark=0.6)
        self.tier = DramTier(config, clock=lambda: self.now)
        self.evicted: list[tuple[str, bytes]] = []
        self.tier.set_evict_callback(lambda key, view: self.evicted.append((key, bytes(view))))
        self.model = Model()
        self.writing: dict[str, tuple[DramWriteHandle, bytes]] = {}
        self.held: list[tuple[DramReadHandle, bytes]] = []
        self.counter = 0

    def teardown(self) -> None:
        self.tier.close()

    def _value(self, size: int) -> bytes:
        self.counter += 1
        return (self.counter.to_bytes(4, "little") * (size // 4 + 1))[:size]

    def _check_evictions(self) -> None:
        """The victims were exactly the oldest unprotected objects, with their bytes."""
        order = [k for k in self.model.values if not self.model.protected(k, self.now)]
        assert [k for k, _ in self.evicted] == order[: len(self.evicted)]
        for key, data in self.evicted:
            assert data == self.model.values[key]
            self.model.drop(key)
        self.evicted.clear()

    def _assert_nothing_fits(self, size: int) -> None:
        """After NoSpaceError: even evicting every unprotected object leaves no
        free run of `size` aligned bytes (checked against the allocator's ranges)."""
        alloc = self.tier._index.alloc
        spans = alloc.free_ranges()
        for key in self.model.values:
            if not self.model.protected(key, self.now):
                entry = self.tier._index.objects[key]
                spans.append((entry.offset, alloc.aligned(entry.size)))
        best, run_start, run_end = 0, 0, -1
        for offset, length in sorted(spans):
            if offset != run_end:
                run_start = offset
            run_end = offset + length
            best = max(best, run_end - run_start)
        assert best < alloc.aligned(size), f"{size} bytes would fit after evictions"

    def _expect_new(self, key: str) -> bool:
        return key not in self.model.values and key not in self.writing

    @rule(key=KEYS, size=SIZES)
    def put(self, key: str, size: int) -> None:
        data = self._value(size)
        if not self._expect_new(key):
            with pytest.raises(ExistsError):
                self.tier.put(key, data)
            return
        try:
            self.tier.put(key, data)
        except NoSpaceError:
            assert self.evicted == []
            self._assert_nothing_fits(size)
            return
        self._check_evictions()
        self.model.values[key] = data

    @rule(key=KEYS, size=SIZES)
    def reserve(self, key: str, size: int) -> None:
        if not self._expect_new(key):
            with pytest.raises(ExistsError):
                self.tier.reserve(key, size)
            return
        try:
            handle = self.tier.reserve(key, size)
        except NoSpaceError:
            assert self.evicted == []
            self._assert_nothing_fits(size)
            return
        self._check_evictions()
        self.writing[key] = (handle, self._value(size))

    @precondition(lambda self: bool(self.writing))
    @rule(data=st.data(), commit=st.booleans())
    def finish(self, data: st.DataObject, commit: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.writing)))
        handle, value = self.writing.pop(key)
        if commit:
            handle.buffer[:] = value
            self.tier.commit(handle)
            self.model.values[key] = value
        else:
            self.tier.abort(handle)
            self.model.pins.pop(key, None)
            self.model.lease_until.pop(key, None)

    @rule(key=KEYS)
    def get(self, key: str) -> None:
        if key in self.writing:
            with pytest.raises(NotReadyError):
                self.tier.get(key)
            return
        assert self.tier.get(key) == self.model.values.get(key)
        if key in self.model.values:
            self.model.touch(key)

    @rule(key=KEYS)
    def acquire(self, key: str) -> None:
        if key in self.writing:
            return
        handle = self.tier.acquire(key)
        assert (handle is None) == (key not in self.model.values)
        if handle is not None:
            self.held.append((handle, self.model.values[key]))
            self.model.readers[key] = self.model.readers.get(key, 0) + 1
            self.model.touch(key)

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        handle, value = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        assert bytes(handle.buffer) == value  # intact even if removed meanwhile
        if handle.key in self.model.readers and self.model.values.get(handle.key) == value:
            self.model.readers[handle.key] -= 1
        handle.release()

    @rule(key=KEYS)
    def remove(self, key: str) -> None:
        if key in self.writing:
            with pytest.raises(NotReadyError):
                self.tier.remove(key)
            return
        assert self.tier.remove(key) == (key in self.model.values)
        if key in self.model.values:
            self.model.drop(key)

    @rule(key=KEYS, pin=st.booleans())
    def pin_or_unpin(self, key: str, pin: bool) -> None:
        present = key in self.model.values or key in self.writing
        pins = self.model.pins.get(key, 0)
        if pin:
            assert self.tier.pin(key) == present
            if present:
                self.model.pins[key] = pins + 1
        else:
            assert self.tier.unpin(key) == (present and pins > 0)
            if present and pins:
                self.model.pins[key] = pins - 1

    @rule(key=KEYS, ttl=st.sampled_from([1.0, 5.0]))
    def lease(self, key: str, ttl: float) -> None:
        present = key in self.model.values or key in self.writing
        assert self.tier.lease(key, ttl) == present
        if present:
            until = max(self.model.lease_until.get(key, -1.0), self.now + ttl)
            self.model.lease_until[key] = until

    @rule(step=st.sampled_from([0.5, 2.0]))
    def advance_clock(self, step: float) -> None:
        self.now += step

    @rule(bad=st.sampled_from([None, 1, b"k0", ""]))
    def bad_key(self, bad: object) -> None:
        with pytest.raises(BadRequestError):
            self.tier.put(bad, b"x")  # type: ignore[arg-type]

    @invariant()
    def consistent(self) -> None:
        self.tier.check_integrity()
        assert self.tier.keys() == list(self.model.values)
        stats = self.tier.stats()
        assert stats.objects == len(self.model.values)
        assert stats.extra["writing"] == len(self.writing)


DramMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
TestDramMachine = DramMachine.TestCase
