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

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

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
    caps = None
    if mint is not None and cache is not None:
        caps = cache.fill(table, rows, slots, offs, sizes, ok, mint)
    elif mint is not None:
        caps = _capabilities(table, slots, offs, sizes, ok, mint)
    uniq = np.unique(slots[ok])
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
        loc_len = loc_len + (caps[2] if len(caps) == 3 else np.where(caps[1] > 0, caps[1] + 2, 0))
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
        w.const(_CAP_TAG + bytes([CAP_BYTES]), caps[1] > 0)
        w._matrix(caps[0], caps[1])


CAP_BYTES = 45  # kvstore.security.capabilities.SIZE
# A capability's fields as numpy reads them (the body packs unsigned; values < 2**63)
_CAP = np.dtype([("mode", "u1"), ("key", "<u4"), ("exp", "<i8"), ("off", "<i8"),
                 ("len", "<i8"), ("tag", "V16")])  # fmt: skip


class CapabilityCache:
    """The capabilities of recent replies, per object row (the first `max_rows` rows):
    a lookup of a row whose cached grant has this reply's mode, expiry (a Minter's,
    rounded to its quantum), range, segment and key reuses it, so a hot key costs one
    MAC per quantum rather than one per lookup. A slot whose segment changed, or a
    node's new key, makes its entries miss."""

    def __init__(self, max_rows: int = 1 << 20) -> None:
        self.max_rows = max_rows
        self.caps = np.zeros(0, _CAP)
        self.slot = np.zeros(0, _I64)
        self._segments: dict[int, object] = {}  # slot -> the segment its entries are for
        self.hits = self.misses = 0

    def _grow(self, n: int) -> None:
        if n <= len(self.caps):
            return
        n = min(self.max_rows, max(n, 2 * len(self.caps), 1024))
        caps, slot = np.zeros(n, _CAP), np.full(n, -1, _I64)
        caps[: len(self.caps)], slot[: len(self.slot)] = self.caps, self.slot
        self.caps, self.slot = caps, slot

    def fill(
        self, table: ObjectTable, rows: np.ndarray, slots: np.ndarray, offs: np.ndarray,
        sizes: np.ndarray, ok: np.ndarray, mint: Mint,
    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """(n x 45 matrix, length per row: 45 or 0) of each ok row's capability."""
        n = len(rows)
        out = np.zeros((n, CAP_BYTES), np.uint8)
        uniq = np.unique(slots[ok])
        if not len(uniq):
            return out, np.zeros(n, _I64)
        segs = [table.segments[s] for s in uniq.tolist()]
        for s, seg in zip(uniq.tolist(), segs, strict=True):
            if self._segments.get(s) is not seg:  # a new segment in this slot
                self.slot[self.slot == s] = -1
                self._segments[s] = seg
        key_of = getattr(mint, "key_id", None)
        keys = np.array([key_of(g.node_id) if key_of else 0 for g in segs], _I64)
        row_key = keys[np.minimum(np.searchsorted(uniq, slots), len(uniq) - 1)]
        has = ok & (row_key >= 0)
        keep = has & (rows < self.max_rows)
        if keep.any():
            self._grow(int(rows[keep].max()) + 1)
        r = np.where(keep, rows, 0)
        if len(self.caps):
            c = self.caps[r]
            valid = keep & (self.slot[r] == slots) & (c["exp"] == getattr(mint, "expiry", -1))
            valid &= (c["off"] == offs) & (c["len"] == sizes) & (c["key"] == row_key)
            valid &= c["mode"] == getattr(mint, "mode", -1)
            out[valid] = c[valid].view(np.uint8).reshape(-1, CAP_BYTES)
        else:
            valid = np.zeros(n, bool)
        miss = np.nonzero(has & ~valid)[0]
        self.hits += int(valid.sum())
        self.misses += len(miss)
        if len(miss):
            self._mint_misses(out, miss, uniq, segs, slots, offs, sizes, row_key, mint)
            stored = miss[keep[miss]]
            self.caps.view(np.uint8).reshape(-1, CAP_BYTES)[rows[stored]] = out[stored]
            self.slot[rows[stored]] = slots[stored]
        return out, np.where(has, CAP_BYTES, 0)

    @staticmethod
    def _mint_misses(
        out: np.ndarray, miss: np.ndarray, uniq: np.ndarray, segs: list[Any], slots: np.ndarray,
        offs: np.ndarray, sizes: np.ndarray, row_key: np.ndarray, mint: Mint,
    ) -> None:  # fmt: skip
        """Fresh grants into `out[miss]`: bodies packed by numpy, one MAC call per row."""
        mac_of = getattr(mint, "mac_of", None)
        if mac_of is None:  # a plain callable: one call per row
            by_slot = {s: (g.node_id, g.name) for s, g in zip(uniq.tolist(), segs, strict=True)}
            fresh = [mint(*by_slot[s], o, n) for s, o, n in
                     zip(slots[miss].tolist(), offs[miss].tolist(), sizes[miss].tolist(),
                         strict=True)]  # fmt: skip
            out[miss] = np.frombuffer(b"".join(fresh), np.uint8).reshape(-1, CAP_BYTES)
            return
        macs = {s: mac_of(g.node_id, g.name) for s, g in zip(uniq.tolist(), segs, strict=True)}
        bodies = np.zeros(len(miss), _CAP)
        bodies["mode"], bodies["key"] = mint.mode, row_key[miss]  # type: ignore[attr-defined]
        bodies["exp"] = mint.expiry  # type: ignore[attr-defined]
        bodies["off"], bodies["len"] = offs[miss], sizes[miss]
        raw = bodies.view(np.uint8).reshape(-1, CAP_BYTES)
        flat = raw[:, :29].tobytes()
        tags = []
        for k, slot in enumerate(slots[miss].tolist()):
            keyed, tail = macs[slot]  # type: ignore[misc]
            h = keyed.copy()
            h.update(flat[29 * k : 29 * k + 29] + tail)
            tags.append(h.digest())
        raw[:, 29:] = np.frombuffer(b"".join(tags), np.uint8).reshape(-1, 16)
        out[miss] = raw


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
