"""Object keys by id, without a Python object per key: a hash table and a byte arena.

Each live id's key is stored once, as UTF-8 bytes in one growing arena
(`off[id]`, `length[id]`), with its hash (`hash[id]`). An open-addressing table
(linear probing, a power-of-two number of slots, load 0.375-0.75) holds ids: a
probe compares the stored hash first and then the key's bytes, so a lookup never
confuses two keys. A Python dict of str costs ~150 bytes per key (the str, its
slot, an int); this costs ~60 at 32-byte keys.

The hash is Python's own `hash(str)` (SipHash, randomized per process, cached in
the str): the table lives in memory only. Batched calls (`find_many`,
`insert_many`) probe every key of a batch at once with numpy; scalar calls
(`find`, `delete`) read the same arrays through memoryviews.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Sequence

import numpy as np

EMPTY, DELETED = -1, -2  # slot values that are no id
MAX_LOAD = 0.75  # filled (live + deleted) slots over all slots before a rebuild
MIN_SLOTS = 1024
SCALAR_TAIL = 8  # keys still probing when the batched loop hands over to `find`
CHUNK_BYTES = 8 << 20  # arena bytes moved per step when compacting (bounds temporaries)
_I64 = np.int64
_hash = hash  # the key hash (a module global so that tests can force collisions)


MMAP_BYTES = 1 << 20  # arrays this big are anonymous mappings (see `zeros`)
HUGE_BYTES = 32 << 20  # mappings this big ask for transparent huge pages (see `zeros`)
_PRIVATE = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)


def zeros(n: int, dtype: type | np.dtype) -> np.ndarray:
    """A zero-filled array; a big one is its own anonymous mapping, so its pages are
    resident only once written and go back to the OS when it is dropped (malloc keeps
    freed big blocks in its heap once it has raised its mmap threshold: grown-and-
    replaced arrays would stay in the RSS).

    A mapping of HUGE_BYTES or more is private (a shared one is shmem, whose huge pages
    the kernel's shmem_enabled usually refuses) and advised MADV_HUGEPAGE: a lookup of a
    random key reads a few rows of arrays of hundreds of MB, and with 4 KiB pages each
    read is a TLB miss too (measured at 10M keys: 20-30% more random lookups per CPU
    second). Resident memory still grows only as pages are written, by 2 MiB at most
    per array beyond the written part."""
    nbytes = n * np.dtype(dtype).itemsize
    if nbytes < MMAP_BYTES:
        return np.zeros(n, dtype)
    if nbytes < HUGE_BYTES or not _PRIVATE:
        return np.frombuffer(mmap.mmap(-1, nbytes), dtype)
    m = mmap.mmap(-1, nbytes, flags=_PRIVATE)
    if hasattr(mmap, "MADV_HUGEPAGE"):  # Linux; THP off or "never": a no-op
        with contextlib.suppress(OSError):
            m.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(m, dtype)


def full(n: int, value: int, dtype: type | np.dtype) -> np.ndarray:
    out = zeros(n, dtype)
    out.fill(value)
    return out


def hashes(keys: Sequence[str]) -> np.ndarray:
    """The hash of each key, as int64 (the table's hash)."""
    return np.fromiter(map(_hash, keys), _I64, len(keys))


class Encoded:
    """The UTF-8 bytes of a batch of keys: one blob, an offset and a length per key."""

    __slots__ = ("blob", "lens", "offs", "raw")

    def __init__(self, keys: Sequence[str]) -> None:
        raw = [k.encode() for k in keys]
        self.raw = raw
        self.lens = np.fromiter(map(len, raw), _I64, len(raw))
        self.offs = np.zeros(len(raw), _I64)
        np.cumsum(self.lens[:-1], out=self.offs[1:])
        self.blob = np.frombuffer(b"".join(raw), np.uint8)


def gather_ranges(src: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The concatenation of src[starts[i] : starts[i] + lens[i]] over i."""
    total = int(lens.sum())
    if not total:
        return src[:0]
    firsts = np.cumsum(lens) - lens
    within = np.arange(total, dtype=_I64) - np.repeat(firsts, lens)
    return src[np.repeat(starts, lens) + within]


class KeyIndex:
    """key (str) <-> id (int >= 0). Ids are chosen by the caller (ObjectTable)."""

    def __init__(self) -> None:
        self._slots = MIN_SLOTS
        self._table = full(self._slots, EMPTY, np.int32)
        self._filled = 0  # slots not EMPTY (live + DELETED)
        self.live = 0
        # per id, one row of a (ids x 3) block (one cache line for a lookup): its key's
        # hash, where the key starts in the arena, its length in bytes (0 = free id)
        self._ids = np.zeros((0, 3), _I64)
        self.hash, self.off, self.length = self._ids[:, 0], self._ids[:, 1], self._ids[:, 2]
        self._arena = np.zeros(1 << 16, np.uint8)
        self._end = 0  # arena bytes written
        self._dead = 0  # arena bytes of deleted keys
        self._views()

    def _views(self) -> None:
        self._table_v = self._table.data
        self._hash_v = self.hash.data
        self._off_v = self.off.data
        self._len_v = self.length.data
        self._arena_v = self._arena.data

    @property
    def arena(self) -> np.ndarray:
        """The key bytes (read-only use: `off`/`length` say where each key is)."""
        return self._arena

    # ---- capacity -----------------------------------------------------------

    def reserve_ids(self, capacity: int) -> None:
        """Make room for ids below `capacity`."""
        if capacity <= len(self.off):
            return
        size = max(capacity, int(len(self.off) * 1.5), 1024)
        block = zeros(size * 3, _I64).reshape(size, 3)
        block[: len(self._ids)] = self._ids
        self._ids = block
        self.hash, self.off, self.length = block[:, 0], block[:, 1], block[:, 2]
        self._views()

    def _reserve_slots(self, more: int) -> None:
        if self._filled + more > MAX_LOAD * self._slots:
            self._rebuild(self.live + more)

    def _rebuild(self, keys: int) -> None:
        """A fresh table for `keys` keys at a load of at most 0.5 (tombstones dropped)."""
        slots = MIN_SLOTS
        while slots * 0.5 < keys:
            slots *= 2
        ids = np.nonzero(self.length)[0]
        self._slots = slots
        self._table = full(slots, EMPTY, np.int32)
        self._filled = 0
        self._views()
        self._place_sorted(ids, self.hash[ids])

    # ---- scalar -------------------------------------------------------------

    def find(self, key: str) -> int:
        """The id of `key`, or -1."""
        h = _hash(key)
        mask = self._slots - 1
        i = h & mask
        kb = None
        while True:
            cand = self._table_v[i]
            if cand == EMPTY:
                return -1
            if cand >= 0 and self._hash_v[cand] == h:
                if kb is None:
                    kb = key.encode()
                if self._equal(cand, kb):
                    return cand
            i = (i + 1) & mask

    def _equal(self, cand: int, kb: bytes) -> bool:
        n = self._len_v[cand]
        start = self._off_v[cand]
        return n == len(kb) and self._arena_v[start : start + n] == kb

    def key_of(self, i: int) -> str:
        start = self._off_v[i]
        return str(self._arena_v[start : start + self._len_v[i]], "utf-8")

    def keys_of(self, ids: np.ndarray) -> list[str]:
        """The key of each id (one gather, then one decode per key)."""
        lens = self.length[ids].astype(_I64)
        blob = gather_ranges(self._arena, self.off[ids], lens).tobytes()
        out, pos = [], 0
        for n in lens.tolist():
            out.append(blob[pos : pos + n].decode())
            pos += n
        return out

    def insert(self, i: int, key: str) -> None:
        """Index one new key (absent) under id `i` (scalar: no numpy call per key)."""
        kb = key.encode()
        if self._filled + 1 > MAX_LOAD * self._slots:
            self._rebuild(self.live + 1)
        if self._end + len(kb) > len(self._arena):
            self._compact(len(kb))
        self._arena_v[self._end : self._end + len(kb)] = kb
        h = _hash(key)
        self._hash_v[i], self._off_v[i], self._len_v[i] = h, self._end, len(kb)
        self._end += len(kb)
        mask = self._slots - 1
        j = h & mask
        while self._table_v[j] >= 0:
            j = (j + 1) & mask
        self._filled += self._table_v[j] == EMPTY
        self._table_v[j] = i
        self.live += 1

    def delete(self, i: int) -> None:
        """Forget the key of id `i`."""
        h = self._hash_v[i]
        mask = self._slots - 1
        j = h & mask
        while self._table_v[j] != EMPTY:
            if self._table_v[j] == i:
                self._table_v[j] = DELETED
                self.live -= 1
                self._dead += self._len_v[i]
                self._len_v[i] = 0
                if self._dead > (1 << 20) and self._dead * 2 > self._end:
                    self._compact(0)
                return
            j = (j + 1) & mask
        raise KeyError(f"id {i} is not indexed")

    # ---- batched ------------------------------------------------------------

    def find_many(self, keys: Sequence[str], enc: Encoded | None = None) -> np.ndarray:
        """The id of each key (-1: absent), probing all keys at once: the first id whose
        stored hash matches is a candidate, and all candidates are checked byte for
        byte at the end (a mismatch, i.e. a hash collision, is probed again, one by one)."""
        n = len(keys)
        out = np.full(n, -1, _I64)
        if not n or not self.live:
            return out
        h = hashes(keys)
        mask = self._slots - 1
        pending = np.arange(n)
        pos = h & mask
        while pending.size > SCALAR_TAIL:
            cand = self._table[pos].astype(_I64)
            done = cand == EMPTY
            hit = np.nonzero(cand >= 0)[0]
            if hit.size:
                hit = hit[self.hash[cand[hit]] == h[pending[hit]]]
                out[pending[hit]] = cand[hit]
                done[hit] = True
            keep = ~done
            pending = pending[keep]
            pos = (pos[keep] + 1) & mask
        found = np.nonzero(out >= 0)[0]
        if found.size:
            same = self._equal_many(out[found], enc or Encoded(keys), found)
            pending = np.concatenate([pending, found[~same]])
            out[found[~same]] = -1
        for q in pending.tolist():
            out[q] = self.find(keys[q])
        return out

    def _equal_many(self, cand: np.ndarray, enc: Encoded, q: np.ndarray) -> np.ndarray:
        """Whether the key of id cand[j] equals query key q[j], for each j."""
        qlen = enc.lens[q]
        ok = self.length[cand].astype(_I64) == qlen
        idx = np.nonzero(ok)[0]
        if not idx.size:
            return ok
        lens = qlen[idx]
        width = int(lens[0])
        if (lens == width).all():  # keys of one length (the usual case): a 2-D gather
            cols = np.arange(width, dtype=_I64)
            mine = self._arena[self.off[cand[idx]][:, None] + cols]
            theirs = enc.blob[enc.offs[q[idx]][:, None] + cols]
            differ = (mine != theirs).any(axis=1)
        else:
            mine = gather_ranges(self._arena, self.off[cand[idx]], lens)
            theirs = gather_ranges(enc.blob, enc.offs[q[idx]], lens)
            firsts = np.cumsum(lens) - lens
            differ = np.logical_or.reduceat(mine != theirs, firsts)
        ok[idx[differ]] = False
        return ok

    def insert_many(self, ids: np.ndarray, keys: Sequence[str], enc: Encoded | None = None) -> None:
        """Index new keys (absent and distinct) under `ids`."""
        if not len(keys):
            return
        enc = enc or Encoded(keys)
        h = hashes(keys)
        self._reserve_slots(len(keys))
        self._store_keys(ids, enc)
        self.hash[ids] = h
        self._place(ids, h)
        self.live += len(keys)

    def _store_keys(self, ids: np.ndarray, enc: Encoded) -> None:
        total = len(enc.blob)
        if self._end + total > len(self._arena):
            self._compact(total)
        self._arena[self._end : self._end + total] = enc.blob
        self.off[ids] = enc.offs + self._end
        self.length[ids] = enc.lens
        self._end += total

    def _place(self, ids: np.ndarray, h: np.ndarray) -> None:
        """Put ids into free slots, the first free slot of each probe sequence. Keys
        aiming at one free slot in a round all write it; the one whose id reads back
        has it, the others probe on."""
        mask = self._slots - 1
        pending = np.arange(len(ids))
        pos = h & mask
        while pending.size:
            cur = self._table[pos]
            free = np.nonzero(cur < 0)[0]
            placed = np.zeros(pending.size, bool)
            if free.size:
                want = ids[pending[free]]
                self._table[pos[free]] = want
                won = free[self._table[pos[free]] == want]
                self._filled += int(np.count_nonzero(cur[won] == EMPTY))
                placed[won] = True
            keep = ~placed
            pending = pending[keep]
            pos = (pos[keep] + 1) & mask

    def _place_sorted(self, ids: np.ndarray, h: np.ndarray) -> None:
        """Put ids into an empty table in one pass (a rebuild): sorted by home slot, each
        takes max(its home, the previous one's slot + 1), i.e. a cumulative max of
        home - rank, plus rank. Each run of ids then fills the slots from its first home
        on with no gap, as linear probing needs. `_place` probes round by round instead:
        ~2 s at 6M keys, a stall of the whole master (its nodes' heartbeats wait)."""
        if not len(ids):
            return
        n = len(ids)
        home = h & (self._slots - 1)
        rank = np.arange(n, dtype=_I64)
        # Sort (home, index) pairs packed in one int64 (numpy's SIMD sort, ~5x argsort):
        # ids are int32 and slots hold them, so index and home take < 62 bits together.
        shift = max(1, (n - 1).bit_length())
        home <<= shift
        home |= rank
        home.sort()
        order = home & ((1 << shift) - 1)
        home >>= shift
        home -= rank  # (in place: at 10M keys each temporary is 80 MB of fresh pages)
        pos = np.maximum.accumulate(home, out=home)
        pos += rank
        inside = int(np.searchsorted(pos, self._slots))  # pos ascends: a prefix fits
        self._table[pos[:inside]] = ids[order[:inside]]
        self._filled = inside
        if inside < len(ids):  # the tail ran past the last slot: probe on from slot 0
            rest = order[inside:]
            self._place(ids[rest], h[rest])

    # ---- arena --------------------------------------------------------------

    def _compact(self, extra: int) -> None:
        """Room for `extra` more bytes: drop dead keys' bytes when they are many, and
        grow (x1.5) when the live ones still do not leave room."""
        packing = self._dead * 4 >= self._end  # many holes: pack the live keys
        used = self._end - self._dead if packing else self._end
        size = len(self._arena)
        if used + extra > 0.8 * size:
            size = max(int(size * 1.5), int((used + extra) * 1.25))
        arena = zeros(size, np.uint8)
        if packing:
            self._end = self._move_live(arena)
            self._dead = 0
        else:
            arena[: self._end] = self._arena[: self._end]
        self._arena = arena
        self._views()

    def _move_live(self, arena: np.ndarray) -> int:
        """Copy every live key into `arena` in arena order, packed; the bytes written."""
        ids = np.nonzero(self.length)[0]
        ids = ids[np.argsort(self.off[ids], kind="stable")]
        lens = self.length[ids].astype(_I64)
        ends = np.cumsum(lens)
        cursor, start = 0, 0
        while start < len(ids):
            stop = int(np.searchsorted(ends, ends[start] - lens[start] + CHUNK_BYTES, "right"))
            stop = max(stop, start + 1)
            part, plen = ids[start:stop], lens[start:stop]
            data = gather_ranges(self._arena, self.off[part], plen)
            arena[cursor : cursor + len(data)] = data
            offs = np.zeros(len(part), _I64)
            np.cumsum(plen[:-1], out=offs[1:])
            self.off[part] = offs + cursor
            cursor += len(data)
            start = stop
        return cursor

    # ---- integrity ----------------------------------------------------------

    def memory_bytes(self) -> int:
        arrays = (self._table, self._ids, self._arena)
        return sum(a.nbytes for a in arrays)

    def check_integrity(self, live_ids: np.ndarray) -> None:
        """`live_ids`: exactly the ids that must have a key."""
        have = np.nonzero(self.length)[0]
        assert np.array_equal(have, np.sort(live_ids)), "ids with keys != live ids"
        assert self.live == len(have), f"live count {self.live} != {len(have)}"
        used = int(self.length[have].astype(_I64).sum())
        assert used + self._dead == self._end <= len(self._arena), "arena accounting"
        held = self._table[self._table >= 0].astype(_I64)
        assert np.array_equal(np.sort(held), have), "table ids != keyed ids"
        assert self._filled == int(np.count_nonzero(self._table != EMPTY)), "filled count"
        assert self._filled <= MAX_LOAD * self._slots + 1, "table over its load"
        keys = self.keys_of(have)
        assert (hashes(keys) == self.hash[have]).all(), "stored hash != hash of the key"
        assert (self.find_many(keys) == have).all(), "a key does not find its id"
        for i, key in zip(have.tolist()[:64], keys[:64], strict=False):
            assert self.find(key) == i, f"scalar find of {key!r}"
