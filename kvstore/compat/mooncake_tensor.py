"""Tensor encoding for the Mooncake facade's tensor API (`put_tensor`, `get_tensor`, TP).

A stored tensor is one object: a small header (magic, dtype, shape) followed by the
tensor's bytes in C order. The header is kvstore's own (Mooncake's wheel uses its
own struct): tensors written through the facade are read back through the facade.
TP forms store shard i of a tensor split along `split_dim` under `<key>_tp_<i>`, as
Mooncake does. torch is imported on first use only.
"""

from __future__ import annotations

import struct
from typing import Any

from kvstore.errors import BadRequestError, CorruptError

MAGIC = b"KVT1"
_HEAD = struct.Struct("<4sBB")  # magic, dtype index, ndim
_DIM = struct.Struct("<q")
MAX_NDIM = 16
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
    head = _HEAD.pack(MAGIC, dtypes.index(t.dtype), t.dim())
    dims = b"".join(_DIM.pack(int(d)) for d in t.shape)
    data = t.view(torch.uint8).reshape(-1).numpy().tobytes() if t.numel() else b""
    return head + dims + data


def header_size(ndim: int) -> int:
    return _HEAD.size + ndim * _DIM.size


def decode(raw: Any) -> Any:
    """The tensor in `raw` (bytes-like; the tensor shares writable memory, else copies)."""
    torch = _torch()
    view = memoryview(raw).cast("B")
    if view.nbytes < _HEAD.size:
        raise CorruptError("object too short for a tensor header")
    magic, code, ndim = _HEAD.unpack_from(view, 0)
    dtypes = _dtypes()
    if magic != MAGIC or code >= len(dtypes) or dtypes[code] is None or ndim > MAX_NDIM:
        raise CorruptError("object is not a tensor written by the facade")
    shape = [_DIM.unpack_from(view, _HEAD.size + i * _DIM.size)[0] for i in range(ndim)]
    body = view[header_size(ndim) :]
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
