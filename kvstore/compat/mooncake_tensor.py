"""Tensor encoding for the Mooncake facade's tensor API (`put_tensor`, `get_tensor`, TP).

A stored tensor is one object: a fixed-size header (magic, dtype, ndim, 16 dims:
`HEADER_BYTES`, what `mooncake.store._tensor_metadata_size()` returns, as Mooncake's
is fixed too) followed by the tensor's bytes in C order. The header is kvstore's own
(Mooncake's wheel uses its own struct): tensors written through the facade are read
back through the facade. Objects in the earlier variable-size form (KVT1) still decode.
TP forms store shard i of a tensor split along `split_dim` under `<key>_tp_<i>`, as
Mooncake does. torch is imported on first use only.
"""

from __future__ import annotations

import struct
from typing import Any

from kvstore.errors import BadRequestError, CorruptError

MAGIC = b"KVT2"  # fixed-size header
MAGIC_V1 = b"KVT1"  # header of 6 + 8 x ndim bytes
_HEAD = struct.Struct("<4sBB")  # magic, dtype index, ndim
_PAD = 2  # to an 8-byte multiple
_DIM = struct.Struct("<q")
MAX_NDIM = 16
HEADER_BYTES = _HEAD.size + _PAD + MAX_NDIM * _DIM.size  # 136
_DTYPE_NAMES = (
    "float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
    "uint8", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2",
    "uint16", "uint32", "uint64",
)  # fmt: skip


def _torch() -> Any:
    import torch

    return torch


def _dtypes() -> list[Any]:
    torch = _torch()
    return [getattr(torch, name, None) for name in _DTYPE_NAMES]


def tp_key(key: str, rank: int) -> str:
    return f"{key}_tp_{rank}"


def encode(tensor: Any) -> bytes:
    """Header + bytes of a CPU (or CUDA: copied to host) tensor; BadRequestError otherwise."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise BadRequestError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    dtypes = _dtypes()
    if tensor.dtype not in dtypes or tensor.dim() > MAX_NDIM:
        raise BadRequestError(f"unsupported tensor dtype/rank {tensor.dtype}/{tensor.dim()}")
    t = tensor.detach().to("cpu").contiguous()
    head = _HEAD.pack(MAGIC, dtypes.index(t.dtype), t.dim()) + bytes(_PAD)
    dims = b"".join(_DIM.pack(int(d)) for d in t.shape).ljust(MAX_NDIM * _DIM.size, b"\0")
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return head + dims + data


def header_size(ndim: int, magic: bytes = MAGIC) -> int:
    if magic == MAGIC_V1:
        return _HEAD.size + ndim * _DIM.size
    return HEADER_BYTES


def _dims_at(magic: bytes) -> int:
    return _HEAD.size + (0 if magic == MAGIC_V1 else _PAD)


def decode(raw: Any) -> Any:
    """The tensor in `raw` (bytes-like; the tensor shares writable memory, else copies)."""
    torch = _torch()
    view = memoryview(raw).cast("B")
    if view.nbytes < _HEAD.size:
        raise CorruptError("object too short for a tensor header")
    magic, code, ndim = _HEAD.unpack_from(view, 0)
    dtypes = _dtypes()
    known = magic in (MAGIC, MAGIC_V1)
    if not known or code >= len(dtypes) or dtypes[code] is None or ndim > MAX_NDIM:
        raise CorruptError("object is not a tensor written by the facade")
    if view.nbytes < header_size(ndim, magic):
        raise CorruptError("object too short for its tensor header")
    first = _dims_at(magic)
    shape = [_DIM.unpack_from(view, first + i * _DIM.size)[0] for i in range(ndim)]
    body = view[header_size(ndim, magic) :]
    dtype = dtypes[code]
    expected = _numel(shape) * torch.empty((), dtype=dtype).element_size()
    if body.nbytes != expected:
        raise CorruptError(f"tensor body has {body.nbytes} bytes, shape needs {expected}")
    if expected == 0:
        return torch.empty(shape, dtype=dtype)
    if view.readonly:
        body = memoryview(bytearray(body))
    return torch.frombuffer(body, dtype=torch.uint8).view(dtype).reshape(shape)


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def shards(tensor: Any, tp_size: int, split_dim: int) -> list[Any]:
    """The `tp_size` shards of `tensor` along `split_dim` (torch.chunk's split, as Mooncake)."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise BadRequestError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tp_size < 1 or not -tensor.dim() <= split_dim < max(1, tensor.dim()):
        raise BadRequestError(f"bad tp_size {tp_size} / split_dim {split_dim}")
    if tp_size == 1:
        return [tensor]
    size = tensor.shape[split_dim]
    step = -(-size // tp_size) if size else 0
    return [tensor.narrow(split_dim, min(i * step, size),
                          max(0, min(step, size - i * step))) for i in range(tp_size)]  # fmt: skip
