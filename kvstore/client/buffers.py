"""Addresses and engine-ready aliases of user memory, and `get`'s result buffers.

User memory becomes a byte view through kvstore.buffers.byte_view (one helper for
the client, the engines and the tiers). Transfer engines only register writable views;
a read-only source (bytes, a read-only array) is registered through a writable
alias of the same memory, which the engine only ever reads from (WRITE ops).
`new_bytes` makes an uninitialised `bytes` object that a READ fills in place, so
`get` returns bytes with one copy (the transfer) instead of two.
"""

from __future__ import annotations

import ctypes
import sys

from kvstore.buffers import address_of


def engine_view(view: memoryview) -> memoryview:
    """`view` itself when writable, else a writable alias of the same bytes (which
    keeps `view`, hence its memory, alive for as long as the alias lives)."""
    if not view.readonly or view.nbytes == 0:
        return view
    return _alias(address_of(view), view.nbytes, view)


_CPYTHON = sys.implementation.name == "cpython"
if _CPYTHON:
    _bytes_from_size = ctypes.pythonapi.PyBytes_FromStringAndSize
    _bytes_from_size.restype = ctypes.py_object
    _bytes_from_size.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]


def new_bytes(size: int) -> tuple[bytes | bytearray, memoryview]:
    """A fresh object of `size` bytes to return from `get`, and a writable view of it.

    On CPython a new, not yet shared `bytes` (filled before anyone sees it, as C code
    does); elsewhere a bytearray.
    """
    if size <= 0 or not _CPYTHON:
        out = bytearray(size)
        return out, memoryview(out)
    data = _bytes_from_size(None, size)
    return data, _alias(ctypes.cast(data, ctypes.c_void_p).value or 0, size, data)


def _alias(address: int, size: int, owner: object) -> memoryview:
    """A writable view of `size` bytes at `address` that keeps `owner` alive: a transfer
    still in flight after a timeout can never write into freed memory."""
    array = (ctypes.c_ubyte * size).from_address(address)
    array._kvstore_owner = owner  # type: ignore[attr-defined]
    return memoryview(array).cast("B")
