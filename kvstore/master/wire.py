"""Hand-built protobuf encodings of the master's per-key replies (the hot path).

Building one upb message per key (a PutStartResult, a Location per replica, a
KeyStatus) costs microseconds of Python each; a batch of 1,000 keys spends most
of its time there. Here each reply is concatenated from cached byte strings (a
Location's node, tier and segment are the same for every replica of one segment)
plus varints, then parsed once, in C, into the reply message. The bytes are what
upb itself writes for the same message (tests compare both).

`lookup_results` and `put_start_results` encode a whole batch from the object
table's rows with numpy (`RowWriter`: each reply row is a sequence of pieces,
varints computed for all rows at once, then scattered into one buffer), so
nothing is cached per object: rows with errors or several replicas are encoded
one by one and dropped into their place.

In secured mode the servicer passes a `Mint` (kvstore.security.capabilities.Minter):
each Location then also carries its capability (field 6), appended as upb would.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from kvstore.errors import KVStoreError
from kvstore.rpc_errors import code_for
from kvstore.types import Location
from kvstore.v1 import master_pb2

if TYPE_CHECKING:
    from kvstore.master.batch import RowBatch
    from kvstore.master.objects import ObjectTable

OK_STATUS = b"\x0a\x00"  # field 1 (status), an empty KeyStatus: code OK
# (node id, segment, offset, length) -> that range's capability, b"" for none
Mint = Callable[[str, str, int, int], bytes]
_CAP_TAG = b"\x32"  # common.Location field 6 (capability), length-delimited
_SMALL = [bytes([n]) for n in range(0x80)]


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte(s), the length, the payload."""
    return tag + varint(len(payload)) + payload


def _string_field(tag: bytes, text: str) -> bytes:
    return field(tag, text.encode()) if text else b""


class LocationEncoder:
    """Encodes Locations; the (node, tier, segment) prefix is cached per segment."""

    def __init__(self) -> None:
        self._prefixes: dict[tuple[str, int, str], bytes] = {}

    def _prefix(self, loc: Location) -> bytes:
        k = (loc.node_id, int(loc.tier), loc.segment)
        prefix = self._prefixes.get(k)
        if prefix is None:
            tier = b"\x10" + varint(k[1]) if k[1] else b""
            prefix = _string_field(b"\x0a", k[0]) + tier + _string_field(b"\x1a", k[2])
            if len(self._prefixes) > 4096:  # segments come and go: bound the cache
                self._prefixes.clear()
            self._prefixes[k] = prefix
        return prefix

    def encode(self, loc: Location) -> bytes:
        """The encoded common.Location message (zero fields omitted, as upb does)."""
        out = self._prefix(loc)
        if loc.offset:
            out += b"\x20" + varint(loc.offset)
        length = _LENGTHS.get(loc.length)
        if length is None:  # object sizes repeat: cache their encodings (bounded)
            length = b"\x28" + varint(loc.length)
            if len(_LENGTHS) < 1024:
                _LENGTHS[loc.length] = length
        return out + length


_LENGTHS: dict[int, bytes] = {}


def with_capability(encoded: bytes, loc: Location, mint: Mint | None) -> bytes:
    """An encoded Location with its capability appended (as is, without `mint`)."""
    if mint is None:
        return encoded
    cap = mint(loc.node_id, loc.segment, loc.offset, loc.length)
    return encoded + field(_CAP_TAG, cap) if cap else encoded


def lookup_result(size: int, group: str, locations: Sequence[bytes]) -> bytes:
    """An encoded LookupResult of a hit: status OK, size, replicas (encoded), group."""
    reps = b"".join([field(b"\x1a", loc) for loc in locations])
    return OK_STATUS + b"\x10" + varint(size) + reps + _string_field(b"\x22", group)


def status_bytes(exc: KVStoreError | None) -> bytes:
    """An encoded KeyStatus message."""
    if exc is None:
        return b""
    return master_pb2.KeyStatus(code=code_for(exc), message=str(exc)).SerializeToString()


def put_start_response(
    results: Sequence[Sequence[Location] | KVStoreError],
    locations: LocationEncoder,
    placed: Callable[[int, list[bytes]], None] | None = None,
) -> master_pb2.PutStartResponse:
    """PutStartResponse: per key, status OK and its locations, or the key's error.
    `placed(i, encoded locations)` is called for each placed key (to reuse them)."""
    parts = []
    for i, r in enumerate(results):
        if isinstance(r, KVStoreError):
            body = field(b"\x0a", status_bytes(r))
        else:
            locs = [locations.encode(loc) for loc in r]
            body = OK_STATUS + b"".join([field(b"\x12", loc) for loc in locs])
            if placed is not None:
                placed(i, locs)
        parts.append(field(b"\x0a", body))
    return master_pb2.PutStartResponse.FromString(b"".join(parts))


def statuses_payload(results: Sequence[KVStoreError | None]) -> bytes:
    """`repeated KeyStatus results = 1` of PutEnd/PutRevoke/Remove replies."""
    if not any(results):
        return OK_STATUS * len(results)
    return b"".join(field(b"\x0a", status_bytes(r)) for r in results)


# ---- whole batches from the object table ---------------------------------------

_I64 = np.int64
SMALL_BATCH = 16  # replies of up to this many keys are encoded key by key


def varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value's varint as (rows x width uint8 matrix, byte count per row)."""
    v = values.astype(np.uint64)
    cols, lens = [], np.ones(len(v), _I64)
    while True:
        rest = v >> np.uint64(7)
        more = rest != 0
        cols.append(
            ((v & np.uint64(0x7F)) | (more.astype(np.uint64) << np.uint64(7))).astype(np.uint8)
        )
        if not more.any():
            break
        lens += more
        v = rest
    return np.stack(cols, axis=1), lens


class RowWriter:
    """`n` byte strings (rows) built piece by piece, all rows at once; a piece may be
    absent from a row (length 0 there)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._parts: list[tuple[str, tuple[np.ndarray, ...]]] = []
        self.lengths = np.zeros(n, _I64)

    def const(self, data: bytes, mask: np.ndarray | None = None) -> None:
        """The same bytes in every row (or the rows of `mask`)."""
        lens = np.full(self.n, len(data), _I64) if mask is None else mask * len(data)
        self._parts.append(("c", (np.frombuffer(data, np.uint8), lens)))
        self.lengths += lens

    def varint(self, values: np.ndarray, mask: np.ndarray | None = None) -> None:
        mat, lens = varints(values)
        self._matrix(mat, lens if mask is None else np.where(mask, lens, 0))

    def _matrix(self, mat: np.ndarray, lens: np.ndarray) -> None:
        self._parts.append(("m", (mat, lens)))
        self.lengths += lens

    def rows(self, mat: np.ndarray, lens: np.ndarray) -> None:
        """Row i gets all of `mat[i]` (lens[i] == its width) or nothing (lens[i] == 0)."""
        self._parts.append(("r", (mat, lens)))
        self.lengths += lens

    def gather(self, src: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> None:
        """Row i gets src[starts[i] : starts[i] + lens[i]]."""
        self._parts.append(("g", (src, starts.astype(_I64), lens.astype(_I64))))
        self.lengths += lens

    def blobs(self, rows: dict[int, bytes]) -> None:
        """Whole byte strings for some rows (encoded one by one)."""
        if not rows:
            return
        idx = np.fromiter(rows, _I64, len(rows))
        data = [rows[i] for i in idx.tolist()]
        lens = np.zeros(self.n, _I64)
        lens[idx] = [len(b) for b in data]
        starts = np.zeros(self.n, _I64)
        starts[idx] = np.cumsum(lens[idx]) - lens[idx]
        self.gather(np.frombuffer(b"".join(data), np.uint8), starts, lens)

    def tobytes(self) -> bytes:
        """All rows, concatenated in order."""
        out = np.empty(int(self.lengths.sum()), np.uint8)
        cursor = np.cumsum(self.lengths) - self.lengths
        for kind, data in self._parts:
            if kind == "c":
                const, lens = data
                rows = np.nonzero(lens)[0]
                out[cursor[rows][:, None] + np.arange(len(const))] = const
            elif kind == "m":
                mat, lens = data
                width = mat.shape[1]
                rows = np.nonzero(lens)[0]
                if (lens[rows] == width).all():  # whole rows or none (capabilities): 2.7x
                    out[cursor[rows][:, None] + np.arange(width)] = mat[rows]
                else:
                    keep = np.arange(width) < lens[:, None]
                    out[(cursor[:, None] + np.arange(width))[keep]] = mat[keep]
            elif kind == "r":  # one copy of `width` bytes per row, no per-byte index
                mat, lens = data
                rows = np.nonzero(lens)[0]
                if len(rows):
                    win = as_strided(out, (len(out) - mat.shape[1] + 1, mat.shape[1]), (1, 1))
                    if len(rows) == self.n:
                        win[cursor] = mat
                    else:
                        win[cursor[rows]] = mat[rows]
            else:
                src, starts, lens = data
                rows = np.nonzero(lens)[0]
                total = int(lens.sum())
                width = int(lens[rows[0]]) if len(rows) else 0
                if total and total == width * len(rows):  # one length (keys of a batch)
                    at = np.arange(width)
                    out[cursor[rows][:, None] + at] = src[starts[rows][:, None] + at]
                elif total:
                    within = np.arange(total, dtype=_I64) - np.repeat(np.cumsum(lens) - lens, lens)
                    out[np.repeat(cursor, lens) + within] = src[np.repeat(starts, lens) + within]
            cursor = cursor + data[-1]  # every piece ends with its lengths
        return out.tobytes()


def _locations(
    w: RowWriter, table: ObjectTable, rows: np.ndarray, ok: np.ndarray, tag: bytes,
    mint: Mint | None = None, cache: CapabilityCache | None = None,
) -> None:  # fmt: skip
    """The single-replica `Location` of each ok row as a length-delimited field `tag`
    (with its capability from `mint`, when given, reused from `cache` where it holds it)."""
    slots = table.col["seg"][rows]
    offs = table.col["offset"][rows]
    sizes = table.col["size"][rows]
    uniq = np.unique(slots[ok])
    caps = None
    if mint is not None and cache is not None and cache.takes(mint):
        caps = cache.fill(table, rows, slots, offs, sizes, ok, mint, uniq)
    elif mint is not None:
        caps = _capabilities(table, slots, offs, sizes, ok, mint)
    pre = [_segment_prefix(table, int(s)) for s in uniq.tolist()]
    plen = np.array([len(p) for p in pre] or [0], _I64)
    pstart = np.cumsum(plen) - plen
    at = np.searchsorted(uniq, slots) if len(uniq) else np.zeros(len(rows), _I64)
    at = np.minimum(at, max(len(uniq) - 1, 0))
    has_off = ok & (offs != 0)
    off_mat, off_len = varints(offs)
    size_mat, size_len = varints(sizes)
    loc_len = plen[at] + np.where(has_off, 1 + off_len, 0) + 1 + size_len
    if caps is not None:  # the field's bytes: tag, length and capability
        loc_len = loc_len + caps[-1]
    w.const(tag, ok)
    w.varint(loc_len, ok)
    w.gather(np.frombuffer(b"".join(pre) or b"\0", np.uint8), pstart[at], np.where(ok, plen[at], 0))
    w.const(b"\x20", has_off)
    w._matrix(off_mat, np.where(has_off, off_len, 0))
    w.const(b"\x28", ok)
    w._matrix(size_mat, np.where(ok, size_len, 0))
    if caps is not None and len(caps) == 3:
        w.gather(*caps)
    elif caps is not None:
        w.rows(*caps)


CAP_BYTES = 45  # kvstore.security.capabilities.SIZE
FIELD_BYTES = 2 + CAP_BYTES  # a Location's capability field: tag, length, capability
_RANGE = slice(2 + 13, 2 + 29)  # a field's offset and length (u64 each) in its bytes
# A capability field as numpy packs it: tag, length, then the capability (its body packs
# unsigned; values < 2**63) and its MAC
_FIELD = np.dtype([("tag", "u1"), ("n", "u1"), ("mode", "u1"), ("key", "<u4"), ("exp", "<i8"),
                   ("off", "<i8"), ("len", "<i8"), ("mac", "V16")])  # fmt: skip
MAC_GROUP = 32  # missed rows per segment, on average, above which MACs are called by map
_UPDATE, _DIGEST = type(hashlib.blake2b()).update, type(hashlib.blake2b()).digest


class CapabilityCache:
    """The encoded capability fields (tag, length, capability: 47 bytes) of recent
    replies, per object row (the first `max_rows` rows), so that a hot key costs one MAC
    per quantum rather than one per lookup, and a hit costs no per-row Python at all.

    Validity is one *epoch* per reply rather than a comparison of every field per row:
    an epoch stands for one grant (mode and expiry: a Minter's, rounded to its quantum),
    the key id of every node and the segment of every slot its fields were minted for.
    A reply whose grant differs (the quantum rolled), or that sees a node's new key or a
    new segment in a slot, starts a new epoch, and every field of an earlier one misses.
    Per row only the epoch, the slot and the range (read from the field's own bytes)
    are compared, as the row may have been reused or moved since."""

    def __init__(self, max_rows: int = 1 << 20) -> None:
        self.max_rows = max_rows
        self.fields = np.zeros((0, FIELD_BYTES), np.uint8)
        self.epoch_of = np.zeros(0, _I64)  # per row: the epoch its field is of (-1: none)
        self.slot = np.zeros(0, _I64)  # per row: the slot its field is for
        self.epoch = 0
        self._grant: tuple[int, int] | None = None  # (mode, expiry) of this epoch
        self._keys: dict[str, int] = {}  # node -> its key id in this epoch
        self._segments: dict[int, tuple[str, str]] = {}  # slot -> its (node, segment)
        self.hits = self.misses = 0

    def _grow(self, n: int) -> None:
        if n <= len(self.fields):
            return
        n = min(self.max_rows, max(n, 2 * len(self.fields), 1024))
        fields, epoch_of = np.zeros((n, FIELD_BYTES), np.uint8), np.full(n, -1, _I64)
        slot = np.full(n, -1, _I64)
        fields[: len(self.fields)], epoch_of[: len(self.epoch_of)] = self.fields, self.epoch_of
        slot[: len(self.slot)] = self.slot
        self.fields, self.epoch_of, self.slot = fields, epoch_of, slot

    @staticmethod
    def takes(mint: Mint) -> bool:
        """Whether grants of `mint` can be cached: a Minter (one mode and expiry per
        reply, key ids and MAC states to read), not a plain callable."""
        return isinstance(getattr(mint, "expiry", None), int) and hasattr(mint, "mac_of")

    def _enter(self, grant: tuple[int, int], slots: list[int], segs: list[Any],
               keys: list[int]) -> None:  # fmt: skip
        """Start a new epoch unless this reply's grant, slots' segments and nodes' keys
        are those of the current one (slots and nodes it has not seen yet join it: no
        field of this epoch is for them)."""
        stale = grant != self._grant
        seen_seg, seen_key = self._segments, self._keys
        where = [(g.node_id, g.name) for g in segs]  # what a MAC covers of a segment
        for s, w, key in zip(slots, where, keys, strict=True):
            if stale:
                break
            stale = seen_seg.get(s, w) != w or seen_key.get(w[0], key) != key
        if stale:
            self.epoch += 1
            self._grant = grant
            seen_seg.clear()
            seen_key.clear()
        for s, w, key in zip(slots, where, keys, strict=True):
            seen_seg[s] = w
            seen_key[w[0]] = key

    def fill(
        self, table: ObjectTable, rows: np.ndarray, slots: np.ndarray, offs: np.ndarray,
        sizes: np.ndarray, ok: np.ndarray, mint: Mint, uniq: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """(n x 47 matrix, length per row: 47 or 0) of each ok row's capability field;
        `uniq`: the slots of the ok rows, sorted, once each."""
        n = len(rows)
        if not len(uniq):
            return np.zeros((n, FIELD_BYTES), np.uint8), np.zeros(n, _I64)
        segs = [table.segments[s] for s in uniq.tolist()]
        keys = [mint.key_id(g.node_id) for g in segs]  # type: ignore[attr-defined]
        self._enter((mint.mode, mint.expiry), uniq.tolist(), segs, keys)  # type: ignore[attr-defined]
        has = ok
        if min(keys) < 0:  # nodes without a key: no capability
            key_arr = np.array(keys, _I64)
            has = ok & (key_arr[np.minimum(np.searchsorted(uniq, slots), len(uniq) - 1)] >= 0)
        keep = has & (rows < self.max_rows)
        if keep.any():
            self._grow(int(rows[keep].max()) + 1)
        if not len(self.fields):
            mat, valid = np.zeros((n, FIELD_BYTES), np.uint8), np.zeros(n, bool)
        else:
            r = rows if int(rows.max()) < len(self.fields) else np.where(keep, rows, 0)
            mat = np.take(self.fields, r, axis=0)
            valid = keep & (self.epoch_of[r] == self.epoch) & (self.slot[r] == slots)
            rng = np.ascontiguousarray(mat[:, _RANGE]).view("<i8")
            valid &= (rng[:, 0] == offs) & (rng[:, 1] == sizes)
        miss = np.nonzero(has & ~valid)[0]
        self.hits += int(valid.sum())
        self.misses += len(miss)
        if len(miss):
            key_arr = np.array(keys, _I64)
            row_key = key_arr[np.minimum(np.searchsorted(uniq, slots[miss]), len(uniq) - 1)]
            fresh = self._mint(miss, uniq, segs, slots, offs, sizes, row_key, mint)
            if len(miss) == n:
                mat = fresh
            else:
                mat[miss] = fresh
            kept = keep[miss]
            at = rows[miss[kept]]
            self.fields[at] = fresh if kept.all() else fresh[kept]
            self.epoch_of[at] = self.epoch
            self.slot[at] = slots[miss[kept]]
        return mat, np.where(has, FIELD_BYTES, 0)

    @staticmethod
    def _mint(
        miss: np.ndarray, uniq: np.ndarray, segs: list[Any], slots: np.ndarray,
        offs: np.ndarray, sizes: np.ndarray, row_key: np.ndarray, mint: Mint,
    ) -> np.ndarray:  # fmt: skip
        """Fresh fields (len(miss) x 47) of rows `miss` (`row_key`: each one's key id):
        packed by numpy; per row one copy of its node's MAC state, update and digest,
        called by map from C when the rows come in large groups by segment."""
        fields = np.zeros(len(miss), _FIELD)
        fields["tag"], fields["n"] = _CAP_TAG[0], CAP_BYTES
        fields["mode"], fields["key"] = mint.mode, row_key  # type: ignore[attr-defined]
        fields["exp"] = mint.expiry  # type: ignore[attr-defined]
        fields["off"], fields["len"] = offs[miss], sizes[miss]
        raw = fields.view(np.uint8).reshape(-1, FIELD_BYTES)
        at = slots[miss]
        if len(miss) < MAC_GROUP * len(uniq):  # small groups: one loop over all rows
            states = {s: mint.mac_of(g.node_id, g.name)  # type: ignore[attr-defined]
                      for s, g in zip(uniq.tolist(), segs, strict=True)}  # fmt: skip
            flat, tags = raw[:, 2:31].tobytes(), []
            for k, slot in enumerate(at.tolist()):
                keyed, tail = states[slot]
                h = keyed.copy()
                h.update(flat[29 * k : 29 * k + 29] + tail)
                tags.append(h.digest())
            raw[:, 31:] = np.frombuffer(b"".join(tags), np.uint8).reshape(-1, 16)
            return raw
        for slot, seg in zip(uniq.tolist(), segs, strict=True):  # by segment, MACs from C
            rows = np.nonzero(at == slot)[0] if len(uniq) > 1 else None
            part = raw if rows is None else raw[rows]
            if not len(part):
                continue
            keyed, tail = mint.mac_of(seg.node_id, seg.name)  # type: ignore[attr-defined]
            width = 29 + len(tail)  # a body, then the segment, NUL and node id
            data = np.empty((len(part), width), np.uint8)
            data[:, :29] = part[:, 2:31]
            data[:, 29:] = np.frombuffer(tail, np.uint8)
            flat, copy = data.tobytes(), keyed.copy
            macs = [copy() for _ in range(len(part))]
            deque(map(_UPDATE, macs, [flat[i : i + width] for i in range(0, len(flat), width)]), 0)
            tags = np.frombuffer(b"".join(map(_DIGEST, macs)), np.uint8).reshape(-1, 16)
            if rows is None:
                raw[:, 31:] = tags
            else:
                raw[rows, 31:] = tags
        return raw


def _capabilities(
    table: ObjectTable, slots: np.ndarray, offs: np.ndarray, sizes: np.ndarray, ok: np.ndarray,
    mint: Mint,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """(bytes, start per row, length per row) of each ok row's capability field."""
    idx = np.nonzero(ok)[0]
    segs = table.segments
    parts = []
    for slot, off, size in zip(slots[idx].tolist(), offs[idx].tolist(), sizes[idx].tolist(),
                               strict=True):  # fmt: skip
        seg = segs[slot]
        cap = mint(seg.node_id, seg.name, off, size)
        parts.append(field(_CAP_TAG, cap) if cap else b"")
    lens = np.zeros(len(slots), _I64)
    lens[idx] = [len(p) for p in parts]
    starts = np.cumsum(lens) - lens
    return np.frombuffer(b"".join(parts) or b"\0", np.uint8), starts, lens


def _segment_prefix(table: ObjectTable, slot: int) -> bytes:
    seg = table.segments[slot]
    tier = b"\x10" + varint(int(seg.tier)) if int(seg.tier) else b""
    return _string_field(b"\x0a", seg.node_id) + tier + _string_field(b"\x1a", seg.name)


def _simple(table: ObjectTable, res: RowBatch) -> tuple[np.ndarray, np.ndarray]:
    """(row ids with -1 replaced by 0, mask of rows encoded by numpy: found, 1 replica)."""
    ok = res.ids >= 0
    if table.extra:
        ok &= ~np.isin(res.ids, np.fromiter(table.extra, _I64, len(table.extra)))
    return np.maximum(res.ids, 0), ok


def _wrap(inner: RowWriter, ok: np.ndarray, blobs: dict[int, bytes]) -> bytes:
    """Each ok row as field 1 (length-delimited) of the reply; other rows from `blobs`."""
    outer = RowWriter(inner.n)
    outer.const(b"\x0a", ok)
    outer.varint(inner.lengths, ok)
    outer._parts.extend(inner._parts)
    outer.lengths += inner.lengths
    outer.blobs(blobs)
    return outer.tobytes()


def lookup_results(
    table: ObjectTable, res: RowBatch, enc: LocationEncoder, mint: Mint | None = None,
    cache: CapabilityCache | None = None,
) -> bytes:  # fmt: skip
    """`repeated LookupResult results = 1` of a BatchLookupResponse for `res` (each
    replica with its capability from `mint`, when given)."""
    n = len(res.ids)
    if n <= SMALL_BATCH:  # a few keys: one by one (numpy's fixed cost would dominate)
        return b"".join(
            field(b"\x0a", field(b"\x0a", status_bytes(res.errors[j])))
            if i < 0 else field(b"\x0a", _lookup_one(table, i, enc, mint))
            for j, i in enumerate(res.ids.tolist())
        )  # fmt: skip
    rows, ok = _simple(table, res)
    blobs: dict[int, bytes] = {}
    for j, i in enumerate(res.ids.tolist()):
        if j in res.errors:
            blobs[j] = field(b"\x0a", field(b"\x0a", status_bytes(res.errors[j])))
        elif not ok[j]:
            blobs[j] = field(b"\x0a", _lookup_one(table, i, enc, mint))
    w = RowWriter(n)
    w.const(OK_STATUS + b"\x10", ok)
    w.varint(table.col["size"][rows], ok)
    _locations(w, table, rows, ok, b"\x1a", mint, cache)
    groups = table.col["group"][rows]
    own = ok & (groups < 0)
    named = ok & (groups >= 0)
    index = table.index
    glen = np.where(own, index.length[rows].astype(_I64), 0)
    names = {j: table.group_name(int(groups[j])).encode() for j in np.nonzero(named)[0].tolist()}
    for j, b in names.items():
        glen[j] = len(b)
    w.const(b"\x22", ok)
    w.varint(glen, ok)
    w.gather(index.arena, index.off[rows], np.where(own, glen, 0))
    w.blobs(names)
    checks = table.col["checksum"][rows]
    w.const(b"\x28", ok & (checks != 0))
    mat, lens = varints(checks)
    w._matrix(mat, np.where(ok & (checks != 0), lens, 0))
    return _wrap(w, ok, blobs)


def _lookup_one(table: ObjectTable, i: int, enc: LocationEncoder, mint: Mint | None) -> bytes:
    g = table.group_v[i]
    group = table.index.key_of(i) if g < 0 else table.group_name(g)
    locs = [with_capability(enc.encode(loc), loc, mint) for loc in table.replicas(i)]
    out = lookup_result(table.size_v[i], group, locs)
    checksum = table.checksum_v[i]
    return out + (b"\x28" + varint(checksum) if checksum else b"")


def put_start_results(
    table: ObjectTable, res: RowBatch, enc: LocationEncoder, mint: Mint | None = None
) -> bytes:
    """`repeated PutStartResult results = 1` of a PutStartResponse for `res` (each
    location with its capability from `mint`, when given)."""
    if len(res.ids) <= SMALL_BATCH:  # a few keys: one by one
        return b"".join(
            _put_start_one(table, res, j, i, enc, mint) for j, i in enumerate(res.ids.tolist())
        )
    rows, ok = _simple(table, res)
    blobs: dict[int, bytes] = {}
    for j, i in enumerate(res.ids.tolist()):
        if j in res.errors:
            blobs[j] = field(b"\x0a", field(b"\x0a", status_bytes(res.errors[j])))
        elif not ok[j]:
            locs = [with_capability(enc.encode(loc), loc, mint) for loc in table.replicas(i)]
            blobs[j] = field(b"\x0a", OK_STATUS + b"".join([field(b"\x12", x) for x in locs]))
    w = RowWriter(len(res.ids))
    w.const(OK_STATUS, ok)
    _locations(w, table, rows, ok, b"\x12", mint)
    return _wrap(w, ok, blobs)


def _put_start_one(
    table: ObjectTable, res: RowBatch, j: int, i: int, enc: LocationEncoder, mint: Mint | None
) -> bytes:
    if i < 0:
        return field(b"\x0a", field(b"\x0a", status_bytes(res.errors[j])))
    locs = [with_capability(enc.encode(loc), loc, mint) for loc in table.replicas(i)]
    return field(b"\x0a", OK_STATUS + b"".join([field(b"\x12", x) for x in locs]))
