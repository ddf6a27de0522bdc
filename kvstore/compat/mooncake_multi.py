"""Multi-buffer and ranged forms of the Mooncake facade (what vLLM's and SGLang's
Mooncake connectors call): an object gathered from / scattered into several
buffers, and byte ranges of objects read into registered buffers.

kvstore moves one contiguous range per object, so a key whose buffers are not
adjacent in memory is gathered into (or read through) one staging buffer: one extra
host copy. Adjacent buffers are passed through as one view, zero-copy. Shape errors
(list lengths, ranges) are per-key INVALID_PARAMS, never an exception.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from kvstore.compat.mooncake_codes import ErrorCode, code_of
from kvstore.compat.mooncake_core import BAD, OK, StoreCore, per_key, view_at
from kvstore.errors import BadRequestError

NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)


def _parts(ptrs: Sequence[int], sizes: Sequence[int]) -> list[memoryview]:
    """Views of one key's buffers; BadRequestError on a shape or range error."""
    if len(ptrs) != len(sizes) or not ptrs:
        raise BadRequestError(f"{len(ptrs)} buffers, {len(sizes)} sizes")
    return [view_at(p, s) for p, s in zip(ptrs, sizes, strict=True)]


def _contiguous(ptrs: Sequence[int], sizes: Sequence[int]) -> bool:
    return all(ptrs[i] + sizes[i] == ptrs[i + 1] for i in range(len(ptrs) - 1))


def gather(ptrs: Sequence[int], sizes: Sequence[int]) -> memoryview:
    """One view of the concatenated buffers (zero-copy when they are adjacent)."""
    views = _parts(ptrs, sizes)
    if _contiguous(ptrs, sizes):
        return view_at(ptrs[0], sum(sizes))
    out = bytearray(sum(sizes))
    pos = 0
    for v in views:
        out[pos : pos + v.nbytes] = v
        pos += v.nbytes
    return memoryview(out)


def scatter(data: memoryview, n: int, ptrs: Sequence[int], sizes: Sequence[int]) -> None:
    """Copy the first `n` bytes of `data` across the buffers, in order."""
    pos = 0
    for p, s in zip(ptrs, sizes, strict=True):
        take = min(s, n - pos)
        if take <= 0:
            return
        ctypes.memmove(p, _address(data, pos), take)
        pos += take


def _address(view: memoryview, offset: int) -> int:
    obj = view.obj
    if isinstance(obj, bytearray):
        return ctypes.addressof((ctypes.c_char * len(obj)).from_buffer(obj)) + offset
    return ctypes.addressof(ctypes.c_char.from_buffer(view)) + offset


class MultiBufferApi(StoreCore):
    """Objects made of several buffers, and ranged reads."""

    def batch_put_from_multi_buffers(
        self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]], config: object = None,
    ) -> list[int]:  # fmt: skip
        """Key i's object is the concatenation of its buffers; a code per key."""
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes):
            return [BAD] * len(keys)
        views: list[Any] = []
        out = [OK] * len(keys)
        for i, (ptrs, sizes) in enumerate(zip(all_buffer_ptrs, all_sizes, strict=True)):
            try:
                views.append(gather(ptrs, sizes))
            except BadRequestError:
                views.append(None)
                out[i] = BAD
        good = [i for i, v in enumerate(views) if v is not None]
        codes = self._batch([keys[i] for i in good], lambda: [views[i] for i in good], config,
                            False)  # fmt: skip
        for i, code in zip(good, codes, strict=True):
            out[i] = code
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
            targets: list[Any] = []
            for i, (ptrs, sizes) in enumerate(zip(all_buffer_ptrs, all_sizes, strict=True)):
                try:
                    _parts(ptrs, sizes)
                    direct = _contiguous(ptrs, sizes)
                    targets.append(view_at(ptrs[0], sum(sizes)) if direct else None)
                except BadRequestError:
                    targets.append(BAD)
                    out[i] = BAD
            staged = {i: memoryview(bytearray(sum(all_sizes[i])))
                      for i, t in enumerate(targets) if t is None}  # fmt: skip
            idx = [i for i, t in enumerate(targets) if t != BAD]
            views = [targets[i] if targets[i] is not None else staged[i] for i in idx]
            for i, r in zip(idx, c.batch_get_into([keys[k] for k in idx], views), strict=True):
                if not isinstance(r, int):
                    out[i] = code_of(r)
                    continue
                if i in staged:
                    scatter(staged[i], r, all_buffer_ptrs[i], all_sizes[i])
                out[i] = r
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
    bufs = [memoryview(bytearray(s)) if s else None for s in sizes]
    idx = [i for i, b in enumerate(bufs) if b is not None]
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
