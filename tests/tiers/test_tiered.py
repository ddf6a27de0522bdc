"""The tiered store over real DRAM (shared memory), SSD (slab file + RocksDB) and HBM tiers."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvstore.errors import BadRequestError, ExistsError, NoSpaceError, TooLargeError
from kvstore.tiers.dram import DramConfig, DramTier
from kvstore.tiers.hbm import HbmConfig, HbmTier, KVLayout
from kvstore.tiers.ssd import SsdConfig, SsdTier
from kvstore.tiers.tiered import TieredConfig, TieredStore
from kvstore.types import ObjectKey, Tier

KIB = 1024


def _dram(objects: int, size: int = KIB) -> DramTier:
    return DramTier(
        DramConfig(capacity_bytes=objects * size, high_watermark=1.0, low_watermark=1.0)
    )


def _ssd(directory: str, capacity: int) -> SsdTier:
    return SsdTier(SsdConfig(directory=directory, capacity_bytes=capacity))


@pytest.fixture
def store(tmp_path: os.PathLike) -> Iterator[TieredStore]:
    s = TieredStore([_dram(4), _ssd(str(tmp_path), 64 * KIB)], TieredConfig(promote_after_hits=2))
    yield s
    s.close()


def val(key: str, size: int = KIB) -> bytes:
    return (key.encode() * size)[:size]


def test_demotion_follows_lru_order(store: TieredStore) -> None:
    for key in "abcd":
        store.put(ObjectKey(key), val(key))
    store.put(ObjectKey("e"), val("e"))  # DRAM full: a (least recent) goes to SSD
    assert store.tier_of(ObjectKey("a")) == Tier.SSD
    assert store.get(ObjectKey("b")) == val("b")  # touch b
    store.put(ObjectKey("f"), val("f"))  # c is now least recent
    assert [store.tier_of(ObjectKey(k)) for k in "abcdef"] == [
        Tier.SSD, Tier.DRAM, Tier.SSD, Tier.DRAM, Tier.DRAM, Tier.DRAM,
    ]  # fmt: skip
    assert store.counters.demotions == 2
    assert store.counters.bytes_demoted == 2 * KIB
    store.check_integrity()


def test_promotion_is_frequency_gated(store: TieredStore) -> None:
    for key in "abcde":
        store.put(ObjectKey(key), val(key))
    assert store.tier_of(ObjectKey("a")) == Tier.SSD
    assert store.get(ObjectKey("a")) == val("a")
    assert store.tier_of(ObjectKey("a")) == Tier.SSD  # one hit: not yet
    out = bytearray(KIB)
    assert store.get_into(ObjectKey("a"), out) == KIB
    assert bytes(out) == val("a")
    assert store.tier_of(ObjectKey("a")) == Tier.DRAM  # second hit: promoted
    assert store.tier_of(ObjectKey("b")) == Tier.SSD  # made room: LRU b demoted
    assert store.counters.promotions == 1
    ssd = store.tiers[Tier.SSD].stats()
    assert ssd.hits == 2
    store.check_integrity()


def test_put_of_a_key_in_any_tier_is_refused(store: TieredStore) -> None:
    for key in "abcde":
        store.put(ObjectKey(key), val(key))
    with pytest.raises(ExistsError):
        store.put(ObjectKey("a"), val("x"))  # lives in SSD
    assert store.get(ObjectKey("a")) == val("a")
    results = store.batch_put([(ObjectKey("z"), val("z")), (ObjectKey("b"), val("b"))])
    assert results[0] is None and isinstance(results[1], ExistsError)
    store.check_integrity()


def test_remove_and_batch_forms(store: TieredStore) -> None:
    for key in "abcde":
        store.put(ObjectKey(key), val(key))
    assert store.batch_exists([ObjectKey(k) for k in "aez"]) == [True, True, False]
    assert store.remove(ObjectKey("a")) is True  # from SSD
    assert store.remove(ObjectKey("a")) is False
    assert store.batch_get([ObjectKey("e"), ObjectKey("a")]) == [val("e"), None]
    short = bytearray(10)
    res = store.batch_get_into([ObjectKey("e"), ObjectKey("q")], [short, bytearray(KIB)])
    assert isinstance(res[0], BadRequestError) and res[1] is None
    assert store.size_of(ObjectKey("e")) == KIB
    store.check_integrity()


def test_pinned_objects_stay_and_full_pinned_tier_refuses(store: TieredStore) -> None:
    for key in "abcd":
        store.put(ObjectKey(key), val(key))
        assert store.pin(ObjectKey(key))
    with pytest.raises(NoSpaceError):
        store.put(ObjectKey("e"), val("e"))
    assert store.exists(ObjectKey("e")) is False
    assert all(store.tier_of(ObjectKey(k)) == Tier.DRAM for k in "abcd")
    assert store.unpin(ObjectKey("a"))
    store.put(ObjectKey("e"), val("e"))
    assert store.tier_of(ObjectKey("a")) == Tier.SSD
    store.check_integrity()


def test_bad_input_changes_nothing(store: TieredStore) -> None:
    store.put(ObjectKey("a"), val("a"))
    with pytest.raises(BadRequestError):
        store.put(b"bytes-key", val("x"))  # type: ignore[arg-type]
    with pytest.raises(BadRequestError):
        store.put(ObjectKey("empty"), b"")
    with pytest.raises(TooLargeError):
        store.put(ObjectKey("huge"), bytes(8 * KIB))
    assert store.keys() == [ObjectKey("a")]
    store.check_integrity()


def test_two_phase_write_is_invisible_until_commit(store: TieredStore) -> None:
    handle = store.reserve(ObjectKey("w"), KIB)
    handle.buffer[:] = val("w")
    assert store.exists(ObjectKey("w")) is False
    with pytest.raises(ExistsError):
        store.put(ObjectKey("w"), val("w"))
    store.commit(handle)
    assert store.get(ObjectKey("w")) == val("w")
    aborted = store.reserve(ObjectKey("v"), KIB)
    store.abort(aborted)
    assert store.exists(ObjectKey("v")) is False
    store.check_integrity()


def test_three_tiers_promote_block_sized_objects_to_hbm(tmp_path: os.PathLike) -> None:
    layout = KVLayout(num_layers=2, block_tokens=4, kv_heads=2, head_dim=8, dtype="float16")
    size = layout.block_bytes
    hbm = HbmTier(HbmConfig(layout=layout, num_blocks=2))
    dram = _dram(3, size)
    store = TieredStore([hbm, dram, _ssd(str(tmp_path), 64 * size)])
    try:
        for key in "abcd":
            store.put(ObjectKey(key), val(key, size))
        assert store.tier_of(ObjectKey("a")) == Tier.SSD
        for _ in range(2):
            assert store.get(ObjectKey("b")) == val("b", size)
        assert store.tier_of(ObjectKey("b")) == Tier.HBM
        for _ in range(2):
            assert store.get(ObjectKey("a")) == val("a", size)  # SSD -> DRAM
        assert store.tier_of(ObjectKey("a")) == Tier.DRAM
        assert store.get(ObjectKey("b")) == val("b", size)  # served from HBM
        assert [s.tier for s in store.stats()] == [Tier.HBM, Tier.DRAM, Tier.SSD]
        store.check_integrity()
    finally:
        store.close()


def test_config_errors() -> None:
    with pytest.raises(BadRequestError):
        TieredStore([])
    with pytest.raises(BadRequestError):
        TieredConfig(promote_after_hits=0)
    with pytest.raises(BadRequestError):
        TieredStore([_dram(1)], TieredConfig(write_tier=Tier.SSD))


KEYS = [ObjectKey(f"k{i}") for i in range(10)]


class TieredModel(RuleBasedStateMachine):
    """Random operation sequences against a dict; nothing committed is ever lost
    (the SSD tier holds every key), and check_integrity holds after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(dir="/dev/shm", prefix="kvstore-tiered-")
        self.store = TieredStore(
            [_dram(4, 2 * KIB), _ssd(self.dir, 64 * KIB)], TieredConfig(promote_after_hits=2)
        )
        self.model: dict[ObjectKey, bytes] = {}
        self.pinned: set[ObjectKey] = set()

    @rule(key=st.sampled_from(KEYS), size=st.integers(1, 2 * KIB), fill=st.integers(0, 255))
    def put(self, key: ObjectKey, size: int, fill: int) -> None:
        value = bytes([fill]) * size
        try:
            self.store.put(key, value)
        except ExistsError:
            assert key in self.model
            return
        except NoSpaceError:
            assert len(self.pinned) >= 3  # only a tier full of pins refuses
            return
        assert key not in self.model
        self.model[key] = value

    @rule(key=st.sampled_from(KEYS))
    def get(self, key: ObjectKey) -> None:
        assert self.store.get(key) == self.model.get(key)

    @rule(key=st.sampled_from(KEYS))
    def remove(self, key: ObjectKey) -> None:
        assert self.store.remove(key) == (key in self.model)
        self.model.pop(key, None)
        self.pinned.discard(key)

    @rule(key=st.sampled_from(KEYS))
    def pin(self, key: ObjectKey) -> None:
        if self.store.pin(key):
            self.pinned.add(key)

    @rule(key=st.sampled_from(KEYS))
    def unpin(self, key: ObjectKey) -> None:
        self.store.unpin(key)
        self.pinned.discard(key)

    @invariant()
    def consistent(self) -> None:
        self.store.check_integrity()
        assert sorted(self.store.keys()) == sorted(self.model)

    def teardown(self) -> None:
        self.store.close()
        for root, _dirs, files in os.walk(self.dir, topdown=False):
            for name in files:
                os.unlink(os.path.join(root, name))
            os.rmdir(root)


TieredModel.TestCase.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)
test_tiered_model = TieredModel.TestCase


class _DramWithMissHook(DramTier):
    """A real DRAM tier that runs `on_miss` once, the first time a get misses: the
    window in which another thread's promotion moves the object past this reader."""

    on_miss: Callable[[], None] | None = None

    def get(self, key: ObjectKey) -> bytes | None:
        value = super().get(key)
        hook, self.on_miss = self.on_miss, None
        if value is None and hook is not None:
            hook()
        return value


def test_reader_overtaken_by_a_promotion_still_finds_the_object(tmp_path: os.PathLike) -> None:
    dram = _DramWithMissHook(
        DramConfig(capacity_bytes=4 * KIB, high_watermark=1.0, low_watermark=1.0)
    )
    store = TieredStore([dram, _ssd(str(tmp_path), 64 * KIB)], TieredConfig(promote_after_hits=2))
    try:
        for key in "abcde":
            store.put(ObjectKey(key), val(key))
        assert store.get(ObjectKey("a")) == val("a")  # first hit, in SSD
        # the next reader misses DRAM; meanwhile a second hit promotes "a" out of SSD
        dram.on_miss = lambda: store._promote(ObjectKey("a"), Tier.SSD, val("a"))
        assert store.get(ObjectKey("a")) == val("a")
        assert store.tier_of(ObjectKey("a")) == Tier.DRAM
        store.check_integrity()
    finally:
        store.close()
