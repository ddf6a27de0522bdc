"""Multi-buffer and ranged forms of the Mooncake facade (what vLLM's and SGLang's
Mooncake connectors call): an object gathered from / scattered into several
buffers, and byte ranges of objects read into registered buffers.

A key's buffers move straight between the pool and the caller's memory: adjacent
buffers as one view (the client's own put/get), scattered ones as one transfer each,
every key's in one batch (kvstore.compat.mooncake_sg). A scattered key whose transfer
fails is done once more through the client's own path with one staging copy (its
replica retries). Shape errors (list lengths, ranges) are per-key INVALID_PARAMS,
never an exception.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from kvstore.client.writes import PutOptions
from kvstore.compat.mooncake_codes import ErrorCode, code_of, put_code
from kvstore.compat.mooncake_config import put_options
from kvstore.compat.mooncake_core import (
    BAD,
    OK,
    StoreCore,
    _config_for,
    _distinct,
    per_key,
    view_at,
)
from kvstore.compat.mooncake_sg import get_parts_op, put_parts_op
from kvstore.errors import BadRequestError, CorruptError, TransferError
from kvstore.types import check_key

NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
# a scattered put or get that failed these ways is done once more the client's own way
_RETRIED = (TransferError, CorruptError)


def _parts(ptrs: Sequence[int], sizes: Sequence[int]) -> list[memoryview]:
    """Views of one key's buffers; BadRequestError on a shape or range error."""
    if len(ptrs) != len(sizes) or not ptrs:
        raise BadRequestError(f"{len(ptrs)} buffers, {len(sizes)} sizes")
    return [view_at(p, s) for p, s in zip(ptrs, sizes, strict=True)]


def _contiguous(ptrs: Sequence[int], sizes: Sequence[int]) -> bool:
    return all(ptrs[i] + sizes[i] == ptrs[i + 1] for i in range(len(ptrs) - 1))


def _coalesced(ptrs: Sequence[int], sizes: Sequence[int]) -> list[memoryview]:
    """One view per run of adjacent buffers (one view when all are adjacent)."""
    _parts(ptrs, sizes)  # checks shapes and ranges
    runs: list[list[int]] = []  # [start, size]
    for p, s in zip(ptrs, sizes, strict=True):
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1][1] += s
        else:
            runs.append([p, s])
    return [view_at(p, s) for p, s in runs]


def _join(parts: Sequence[memoryview]) -> memoryview:
    out = bytearray(sum(p.nbytes for p in parts))
    pos = 0
    for p in parts:
        out[pos : pos + p.nbytes] = p
        pos += p.nbytes
    return memoryview(out)


def _scatter_views(data: memoryview, n: int, parts: Sequence[memoryview]) -> None:
    """Copy the first `n` bytes of `data` across `parts`, in order."""
    pos = 0
    for p in parts:
        take = min(p.nbytes, n - pos)
        if take <= 0:
            return
        p[:take] = data[pos : pos + take]
        pos += take


def _address(view: memoryview, offset: int) -> int:
    obj = view.obj
    if isinstance(obj, bytearray):
        return ctypes.addressof((ctypes.c_char * len(obj)).from_buffer(obj)) + offset
    return ctypes.addressof(ctypes.c_char.from_buffer(view)) + offset


class MultiBufferApi(StoreCore):
    """Objects made of several buffers, and ranged reads."""

    # False: scattered buffers go through one staging copy (the path before zero-copy;
    # bench/facade_multibuf.py compares the two in one run)
    multi_zero_copy = True

    def batch_put_from_multi_buffers(
        self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]], config: object = None,
    ) -> list[int]:  # fmt: skip
        """Key i's object is the concatenation of its buffers; a code per key. Adjacent
        buffers move as one view; scattered ones each straight to the pool."""
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes):
            return [BAD] * len(keys)
        out = [OK] * len(keys)
        parts: dict[int, list[memoryview]] = {}
        for i, (ptrs, sizes) in enumerate(zip(all_buffer_ptrs, all_sizes, strict=True)):
            try:
                parts[i] = _coalesced(ptrs, sizes)
            except BadRequestError:
                out[i] = BAD
        groups = getattr(config, "group_ids", None)
        if groups is not None and len(groups) != len(keys):
            return [BAD] * len(keys)  # one group id per key
        whole = [i for i, ps in parts.items() if len(ps) == 1]
        codes = self._batch([keys[i] for i in whole], lambda: [parts[i][0] for i in whole],
                            _config_for(config, whole), False)  # fmt: skip
        for i, code in zip(whole, codes, strict=True):
            out[i] = code
        scattered = [i for i, ps in parts.items() if len(ps) > 1]
        if scattered:
            sub_keys, sub_config = [keys[i] for i in scattered], _config_for(config, scattered)
            res = self._call(lambda c: self._put_scattered(c, sub_keys,
                             [parts[i] for i in scattered], sub_config), put_code)  # fmt: skip
            for i, code in zip(scattered, per_key(res, len(scattered)), strict=True):
                out[i] = code
        return out

    def _put_scattered(self, c: Any, keys: Sequence[str], parts: Sequence[list[memoryview]],
                       config: object) -> list[int]:  # fmt: skip
        opts = put_options(config, len(keys))
        out = [OK] * len(keys)
        for kw in _distinct(opts):
            idx = [i for i, o in enumerate(opts) if o == kw]
            errs: list[Any] = [TransferError("staged")] * len(idx)
            if self.multi_zero_copy:
                wire = [c.config.wire_key(check_key(keys[i])) for i in idx]
                op = put_parts_op(c.ops.ctx, wire, [parts[i] for i in idx], PutOptions(**kw))
                errs = c.run(op)
            again = [i for i, e in zip(idx, errs, strict=True) if isinstance(e, _RETRIED)]
            for i, err in zip(idx, errs, strict=True):
                out[i] = put_code(err)
            if again:  # the client's own path: a staging copy, its retries and fencing
                staged = [_join(parts[i]) for i in again]
                for i, err in zip(again, c.batch_put_from([keys[i] for i in again], staged,
                                                          **kw), strict=True):  # fmt: skip
                    out[i] = put_code(err)
        self._note_written(c, [k for k, code in zip(keys, out, strict=True) if code == OK])
        return out

    def batch_get_into_multi_buffers(
        self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]], prefer_alloc_in_same_node: bool = False,
    ) -> list[int]:  # fmt: skip
        """Scatter key i's object across its buffers; bytes read or a code, per key.
        An object larger than its buffers together is INVALID_PARAMS."""
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes):
            return [BAD] * len(keys)

        def run(c: Any) -> list[int]:
            out = [OK] * len(keys)
            parts: dict[int, list[memoryview]] = {}
            for i, (ptrs, sizes) in enumerate(zip(all_buffer_ptrs, all_sizes, strict=True)):
                try:
                    parts[i] = _coalesced(ptrs, sizes)
                except BadRequestError:
                    out[i] = BAD
            whole = [i for i, ps in parts.items() if len(ps) == 1]
            if whole:
                got = c.batch_get_into([keys[i] for i in whole], [parts[i][0] for i in whole])
                for i, r in zip(whole, got, strict=True):
                    out[i] = r if isinstance(r, int) else code_of(r)
            scattered = [i for i, ps in parts.items() if len(ps) > 1]
            if not scattered:
                return out
            res: list[Any] = [TransferError("staged")] * len(scattered)
            if self.multi_zero_copy:
                wire = [c.config.wire_key(check_key(keys[i])) for i in scattered]
                res = c.run(get_parts_op(c.ops.ctx, wire, [parts[i] for i in scattered]))
            for i, r in zip(scattered, res, strict=True):
                out[i] = r if isinstance(r, int) else code_of(r)
            again = [i for i, r in zip(scattered, res, strict=True) if isinstance(r, _RETRIED)]
            if again:  # the client's own read (replica retries, corruption reports), staged
                staged = [memoryview(bytearray(sum(v.nbytes for v in parts[i]))) for i in again]
                got = c.batch_get_into([keys[i] for i in again], staged)
                for i, buf, r in zip(again, staged, got, strict=True):
                    if isinstance(r, int):
                        _scatter_views(buf, r, parts[i])
                    out[i] = r if isinstance(r, int) else code_of(r)
            return out

        return per_key(self._call(run, code_of), len(keys))

    def batch_put_from_multi_buffer_ranges(
        self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]], all_dst_offsets: Sequence[Sequence[int]],
    ) -> list[int]:  # fmt: skip
        """Key i's object has buffer j's bytes at offset dst_offsets[j]; its size is the
        end of the last range (gaps are zero). A code per key."""
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes) == len(all_dst_offsets):
            return [BAD] * len(keys)
        views: list[Any] = []
        out = [OK] * len(keys)
        for i, (ptrs, sizes, offs) in enumerate(
            zip(all_buffer_ptrs, all_sizes, all_dst_offsets, strict=True)
        ):
            try:
                views.append(_assemble(ptrs, sizes, offs))
            except BadRequestError:
                views.append(None)
                out[i] = BAD
        good = [i for i, v in enumerate(views) if v is not None]
        codes = self._batch([keys[i] for i in good], lambda: [views[i] for i in good], None,
                            False)  # fmt: skip
        for i, code in zip(good, codes, strict=True):
            out[i] = code
        return out

    def batch_get_into_multi_buffer_ranges(
        self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]], all_src_offsets: Sequence[Sequence[int]],
    ) -> list[int]:  # fmt: skip
        """Buffer j of key i gets the object's bytes [src_offsets[j], +sizes[j]); the
        bytes read per key, or a code (a range past the object's end is INVALID_PARAMS)."""
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes) == len(all_src_offsets):
            return [BAD] * len(keys)

        def run(c: Any) -> list[int]:
            values = _read_whole(c, keys)
            out = []
            for i, value in enumerate(values):
                if isinstance(value, int):
                    out.append(value)
                    continue
                ptrs, sizes, offs = all_buffer_ptrs[i], all_sizes[i], all_src_offsets[i]
                triples = zip(ptrs, sizes, offs, strict=False)
                codes = [_copy_range(value, p, o, s) for p, s, o in triples]
                bad = next((code for code in codes if code < 0), None)
                if len(ptrs) != len(sizes) or len(ptrs) != len(offs):
                    bad = BAD
                out.append(bad if bad is not None else sum(codes))
            return out

        return per_key(self._call(run, code_of), len(keys))

    def get_into_ranges(
        self, buffer_ptrs: Sequence[int], all_keys: Sequence[Sequence[str]],
        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
        all_src_offsets: Sequence[Sequence[Sequence[int]]],
        all_sizes: Sequence[Sequence[Sequence[int]]],
    ) -> list[list[list[int]]]:  # fmt: skip
        """Buffer-major ranged reads: results[b][k][f] is the bytes fragment f of key k
        read into buffer b, or a negative code (missing key, range out of bounds)."""
        shape = [[len(s) for s in sizes] for sizes in all_sizes]
        if not len(buffer_ptrs) == len(all_keys) == len(all_dst_offsets) == len(all_src_offsets):
            return [[[BAD] for _ in keys] for keys in all_keys]
        unique = sorted({k for keys in all_keys for k in keys})
        values = self._call(lambda c: dict(zip(unique, _read_whole(c, unique), strict=True)),
                            code_of)  # fmt: skip
        out: list[list[list[int]]] = []
        for b, keys in enumerate(all_keys):
            row: list[list[int]] = []
            for k, key in enumerate(keys):
                row.append(self._fragments(values, b, k, key, buffer_ptrs, all_dst_offsets,
                                           all_src_offsets, all_sizes, shape))  # fmt: skip
            out.append(row)
        return out

    def _fragments(self, values: Any, b: int, k: int, key: str, buffer_ptrs: Sequence[int],
                   dsts: Any, srcs: Any, sizes: Any, shape: Any) -> list[int]:  # fmt: skip
        try:
            dst, src, size = dsts[b][k], srcs[b][k], sizes[b][k]
        except IndexError:
            return [BAD]
        if not len(dst) == len(src) == len(size):
            return [BAD] * max(1, len(size)) if (dst or src or size) else []
        if isinstance(values, int):
            return [values] * len(size)
        value = values[key]
        if isinstance(value, int):
            return [value] * len(size)
        # the buffer's extent is not passed: the registered region it lies in bounds it
        room = self._room(buffer_ptrs[b])
        return [_copy_range(value, buffer_ptrs[b] + d, o, s) if d >= 0 and d + s <= room
                else BAD for d, o, s in zip(dst, src, size, strict=True)]  # fmt: skip


def _assemble(ptrs: Sequence[int], sizes: Sequence[int], offs: Sequence[int]) -> memoryview:
    views = _parts(ptrs, sizes)
    if len(offs) != len(views) or any(o < 0 for o in offs):
        raise BadRequestError("one non-negative offset per buffer")
    out = bytearray(max(o + v.nbytes for o, v in zip(offs, views, strict=True)))
    for o, v in zip(offs, views, strict=True):
        out[o : o + v.nbytes] = v
    return memoryview(out)


def _read_whole(c: Any, keys: Sequence[str]) -> list[memoryview | int]:
    """Each key's whole value (or its code): sizes, then one batched read."""
    if not keys:
        return []
    sizes = [s or 0 for s in c.run(c.ops.batch_size_of(list(keys)))]
    bufs = {i: memoryview(bytearray(s)) for i, s in enumerate(sizes) if s}
    idx = list(bufs)
    out: list[memoryview | int] = [NOT_FOUND] * len(keys)
    for i, r in zip(idx, c.batch_get_into([keys[i] for i in idx], [bufs[i] for i in idx]),
                    strict=True):  # fmt: skip
        out[i] = bufs[i][:r] if isinstance(r, int) else code_of(r)
    return out


def _copy_range(value: memoryview, dst_ptr: int, src: int, size: int) -> int:
    """Copy value[src:src+size] to dst_ptr; bytes copied or INVALID_PARAMS."""
    if size < 0 or src < 0 or src + size > value.nbytes:
        return BAD
    if size:
        ctypes.memmove(dst_ptr, _address(value, src), size)
    return size
