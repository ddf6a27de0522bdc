"""The tiered store: HBM / DRAM / SSD tiers composed behind one key-value API.

Each object lives in exactly one tier (exclusive caching). New objects go to the
write tier (DRAM by default). When a tier evicts an object, it is demoted to the
next slower tier (offload-on-evict); the slowest tier drops it. A hit in a slower
tier counts towards promotion: after `promote_after_hits` hits the object is moved
to the next faster tier that accepts it (frequency-gated, so a one-off scan does
not flush the fast tiers).

Promotion, demotion and writes hold one store lock, so no reader ever sees an
object in two tiers or in none while it moves; plain reads go straight to the
tiers, which are thread-safe themselves.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kvstore.buffers import byte_view
from kvstore.errors import BadRequestError, ExistsError, KVStoreError
from kvstore.tiers.base import BytesLike, EvictCallback, ObjectTier, TierStats, WriteHandle
from kvstore.types import ObjectKey, Tier, check_key

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TieredConfig:
    """Policy knobs of the tiered store."""

    write_tier: Tier = Tier.DRAM
    promote_after_hits: int = 2
    max_tracked_keys: int = 65536
    demote_on_evict: bool = True

    def __post_init__(self) -> None:
        if self.promote_after_hits < 1:
            raise BadRequestError("promote_after_hits must be >= 1")
        if self.max_tracked_keys < 1:
            raise BadRequestError("max_tracked_keys must be >= 1")


@dataclass(slots=True)
class StoreCounters:
    """Movement between tiers, in objects and bytes."""

    promotions: int = 0
    demotions: int = 0
    dropped: int = 0
    demotion_failures: int = 0
    bytes_promoted: int = 0
    bytes_demoted: int = 0


class TieredStore:
    """Objects by key across up to three tiers, fastest first."""

    def __init__(self, tiers: Sequence[ObjectTier], config: TieredConfig | None = None) -> None:
        self.config = config or TieredConfig()
        self._tiers: dict[Tier, ObjectTier] = {}
        for tier in tiers:
            if tier.tier in self._tiers:
                raise BadRequestError(f"two tiers of kind {tier.tier.name}")
            self._tiers[tier.tier] = tier
        if not self._tiers:
            raise BadRequestError("a tiered store needs at least one tier")
        self._order = sorted(self._tiers)
        if self.config.write_tier not in self._tiers:
            raise BadRequestError(f"write tier {self.config.write_tier.name} is not configured")
        self._lock = threading.RLock()
        self._hits: OrderedDict[ObjectKey, int] = OrderedDict()
        self.counters = StoreCounters()
        for kind in self._order:
            callback = self._demoter(kind) if self.config.demote_on_evict else None
            self._tiers[kind].set_evict_callback(callback)

    # ---- tiers -------------------------------------------------------------------------

    @property
    def tiers(self) -> dict[Tier, ObjectTier]:
        return dict(self._tiers)

    def tier_of(self, key: ObjectKey) -> Tier | None:
        """The tier that holds `key` now, or None."""
        for kind in self._order:
            if self._tiers[kind].exists(key):
                return kind
        return None

    # ---- writes ------------------------------------------------------------------------

    def reserve(self, key: ObjectKey, size: int) -> WriteHandle:
        """Two-phase write, step 1: space in the write tier, invisible until commit."""
        key = check_key(key)
        with self._lock:
            self._refuse_existing(key)
            return self._tiers[self.config.write_tier].reserve(key, size)

    def commit(self, handle: WriteHandle) -> None:
        with self._lock:
            self._tiers[self.config.write_tier].commit(handle)

    def abort(self, handle: WriteHandle) -> None:
        with self._lock:
            self._tiers[self.config.write_tier].abort(handle)

    def put(self, key: ObjectKey, value: BytesLike) -> None:
        """Store a new object in the write tier; ExistsError if any tier has it."""
        key = check_key(key)
        with self._lock:
            self._refuse_existing(key)
            self._tiers[self.config.write_tier].put(key, value)

    def batch_put(self, items: Sequence[tuple[ObjectKey, BytesLike]]) -> list[Exception | None]:
        """Put each item; one result per item (None = stored)."""
        return [_capture(self.put, key, value) for key, value in items]

    # ---- reads -------------------------------------------------------------------------

    def get(self, key: ObjectKey) -> bytes | None:
        """The object's bytes from the fastest tier that has it, or None."""
        key = check_key(key)
        found = self._read(key, lambda tier: tier.get(key))
        if found is None:
            return None
        kind, value = found
        self._note_hit(key, kind, value)
        return value

    def get_into(self, key: ObjectKey, out: memoryview | bytearray) -> int | None:
        """Copy the object into `out`; returns its size, or None when absent."""
        key = check_key(key)
        view = byte_view(out, writable=True, what="out")
        found = self._read(key, lambda tier: tier.get_into(key, view))
        if found is None:
            return None
        kind, size = found
        self._note_hit(key, kind, view[:size])
        return size

    def _read(
        self, key: ObjectKey, read: Callable[[ObjectTier], T | None]
    ) -> tuple[Tier, T] | None:
        """The first tier, fastest first, where `read` finds the object. Reads run
        without the store lock; a miss in every tier is checked again under it (with
        `exists`, which counts no miss), since a promotion can move the object up past
        a reader between two tiers."""
        for kind in self._order:
            result = read(self._tiers[kind])
            if result is not None:
                return kind, result
        with self._lock:
            found = self.tier_of(key)
            result = None if found is None else read(self._tiers[found])
        return None if found is None or result is None else (found, result)

    def batch_get(self, keys: Sequence[ObjectKey]) -> list[bytes | None]:
        return [self.get(key) for key in keys]

    def batch_get_into(
        self, keys: Sequence[ObjectKey], outs: Sequence[memoryview | bytearray]
    ) -> list[int | Exception | None]:
        """get_into per key; an error for one key (e.g. a short buffer) is returned, not raised."""
        if len(keys) != len(outs):
            raise BadRequestError("batch_get_into needs one buffer per key")
        return [_capture(self.get_into, key, out) for key, out in zip(keys, outs, strict=True)]

    def exists(self, key: ObjectKey) -> bool:
        return self.tier_of(check_key(key)) is not None

    def batch_exists(self, keys: Sequence[ObjectKey]) -> list[bool]:
        found = [False] * len(keys)
        for kind in self._order:
            missing = [i for i, hit in enumerate(found) if not hit]
            if not missing:
                break
            answers = self._tiers[kind].batch_exists([keys[i] for i in missing])
            for i, hit in zip(missing, answers, strict=True):
                found[i] = hit
        return found

    def size_of(self, key: ObjectKey) -> int | None:
        for kind in self._order:
            size = self._tiers[kind].size_of(key)
            if size is not None:
                return size
        return None

    # ---- removal and pins --------------------------------------------------------------

    def remove(self, key: ObjectKey) -> bool:
        """Remove the object from every tier; False if no tier had it."""
        key = check_key(key)
        with self._lock:
            self._hits.pop(key, None)
            removed = [self._tiers[kind].remove(key) for kind in self._order]
        return any(removed)

    def batch_remove(self, keys: Sequence[ObjectKey]) -> list[bool]:
        return [self.remove(key) for key in keys]

    def pin(self, key: ObjectKey) -> bool:
        """Keep the object in its tier (no eviction, no demotion) until unpinned."""
        with self._lock:
            kind = self.tier_of(check_key(key))
            return kind is not None and self._tiers[kind].pin(key)

    def unpin(self, key: ObjectKey) -> bool:
        with self._lock:
            kind = self.tier_of(check_key(key))
            return kind is not None and self._tiers[kind].unpin(key)

    def keys(self) -> list[ObjectKey]:
        with self._lock:
            return [key for kind in self._order for key in self._tiers[kind].keys()]

    # ---- movement between tiers ---------------------------------------------------------

    def _note_hit(self, key: ObjectKey, kind: Tier, value: BytesLike) -> None:
        if kind == self._order[0]:
            return
        with self._lock:
            hits = self._hits.pop(key, 0) + 1
            if hits < self.config.promote_after_hits:
                self._hits[key] = hits
                while len(self._hits) > self.config.max_tracked_keys:
                    self._hits.popitem(last=False)
                return
            self._promote(key, kind, value)

    def _promote(self, key: ObjectKey, source: Tier, value: BytesLike) -> None:
        """Move `key` (whose bytes the caller just read) from `source` to the next
        faster tier that accepts it."""
        if not self._tiers[source].exists(key):
            return  # removed or demoted further since the read
        for target in reversed([k for k in self._order if k < source]):
            try:
                self._tiers[target].put(key, value)
            except KVStoreError:
                continue
            self._tiers[source].remove(key)
            self.counters.promotions += 1
            self.counters.bytes_promoted += len(value)
            return

    def _demoter(self, kind: Tier) -> EvictCallback:
        slower = [k for k in self._order if k > kind]

        def demote(key: ObjectKey, view: memoryview) -> None:
            self._hits.pop(key, None)
            if not slower:
                self.counters.dropped += 1
                return
            try:
                self._tiers[slower[0]].put(key, view)
            except KVStoreError:
                self.counters.demotion_failures += 1
                return
            self.counters.demotions += 1
            self.counters.bytes_demoted += len(view)

        return demote

    def _refuse_existing(self, key: ObjectKey) -> None:
        for kind in self._order:
            if self._tiers[kind].exists(key):
                raise ExistsError(f"key {key!r} already stored in {kind.name}")

    # ---- inspection --------------------------------------------------------------------

    def stats(self) -> list[TierStats]:
        return [self._tiers[kind].stats() for kind in self._order]

    def check_integrity(self) -> None:
        """Each tier is consistent and no key is held by two tiers."""
        with self._lock:
            seen: dict[ObjectKey, Tier] = {}
            for kind in self._order:
                tier = self._tiers[kind]
                tier.check_integrity()
                for key in tier.keys():
                    assert key not in seen, f"{key!r} in both {seen[key].name} and {kind.name}"
                    seen[key] = kind

    def close(self) -> None:
        for kind in self._order:
            self._tiers[kind].close()


def _capture(fn: Callable[..., T], *args: object) -> T | KVStoreError:
    """Call fn; a kvstore error becomes the result instead of propagating (batch calls)."""
    try:
        result = fn(*args)
    except KVStoreError as exc:
        return exc
    return result
