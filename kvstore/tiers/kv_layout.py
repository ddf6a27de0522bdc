"""Shape and dtype of a paged KV cache, and byte views of host block tensors.

One pool block holds `block_tokens` tokens of K and V for every layer. On the
device each layer is one tensor `[num_blocks, 2, block_tokens, kv_heads, head_dim]`
(vLLM's per-layer layout); on the host blocks are block-major,
`[n, num_layers, 2, block_tokens, kv_heads, head_dim]`, so the bytes of one block
across all layers are contiguous and can be stored as one object.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvstore.buffers import byte_view
from kvstore.errors import BadRequestError, TooLargeError

_DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "int8": torch.int8,
    "uint8": torch.uint8,
}


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The KV geometry of one model (per tensor-parallel rank)."""

    num_layers: int
    block_tokens: int
    kv_heads: int
    head_dim: int
    dtype: str = "float16"

    def __post_init__(self) -> None:
        for name in ("num_layers", "block_tokens", "kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise BadRequestError(f"{name} must be a positive int, got {value!r}")
        if self.dtype not in _DTYPES:
            raise BadRequestError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return self.torch_dtype.itemsize

    @property
    def layer_block_shape(self) -> tuple[int, int, int, int]:
        """Shape of one block in one layer: (2, block_tokens, kv_heads, head_dim)."""
        return (2, self.block_tokens, self.kv_heads, self.head_dim)

    @property
    def block_bytes_per_layer(self) -> int:
        return 2 * self.block_tokens * self.kv_heads * self.head_dim * self.itemsize

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all layers, K and V: the size of one object."""
        return self.num_layers * self.block_bytes_per_layer

    def host_shape(self, n: int) -> tuple[int, ...]:
        """Block-major host shape of `n` blocks."""
        return (n, self.num_layers, *self.layer_block_shape)


@dataclass(frozen=True, slots=True)
class HbmConfig:
    """A paged KV pool of `num_blocks` blocks on `device` ("auto": cuda if available).

    Batched moves go through staging buffers of at most `staging_bytes` (at least one
    block), so a large batch is moved in a few bulk copies instead of an unbounded
    device buffer; 256 MiB keeps the per-copy overhead far below 1% at 55 GB/s."""

    layout: KVLayout
    num_blocks: int
    device: str = "auto"
    staging_bytes: int = 256 * 2**20

    def __post_init__(self) -> None:
        if not isinstance(self.layout, KVLayout):
            raise BadRequestError("layout must be a KVLayout")
        if not isinstance(self.num_blocks, int) or self.num_blocks <= 0:
            raise BadRequestError(f"num_blocks must be a positive int, got {self.num_blocks!r}")
        if not isinstance(self.staging_bytes, int) or self.staging_bytes <= 0:
            raise BadRequestError(f"staging_bytes must be a positive int: {self.staging_bytes!r}")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError) as exc:
                raise BadRequestError(f"bad device {self.device!r}") from exc

    @property
    def capacity_bytes(self) -> int:
        return self.num_blocks * self.layout.block_bytes

    @property
    def staging_blocks(self) -> int:
        """Blocks moved per bulk copy."""
        return max(1, self.staging_bytes // self.layout.block_bytes)


def resolve_device(spec: str) -> torch.device:
    """ "auto" -> cuda when available else cpu; a cuda device without CUDA is an error."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BadRequestError(f"device {spec!r} requested but CUDA is not available")
    if device.type not in ("cpu", "cuda"):
        raise BadRequestError(f"unsupported device type {device.type!r}")
    if device.type == "cuda" and device.index is None:  # tensors report cuda:N
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def block_to_bytes(block: torch.Tensor) -> memoryview:
    """Zero-copy byte view of a contiguous host tensor (e.g. one offloaded block)."""
    return byte_view(block, what="block")


def as_byte_array(data: object) -> np.ndarray:
    """A read-only uint8 numpy view of any contiguous buffer, without copying."""
    return np.frombuffer(byte_view(data, what="value"), dtype=np.uint8)


def bytes_into_block(data: object, out: torch.Tensor) -> torch.Tensor:
    """Copy `data` (exactly out's bytes) into the contiguous host tensor `out`: one memcpy."""
    src = as_byte_array(data)
    dst = block_to_bytes(out)
    if src.nbytes != dst.nbytes:
        raise BadRequestError(f"got {src.nbytes} bytes for a {dst.nbytes}-byte block")
    np.copyto(np.frombuffer(dst, dtype=np.uint8), src)
    return out


def bytes_as_block(data: object, layout: KVLayout) -> torch.Tensor:
    """`data` as a host block tensor [num_layers, 2, ...]: zero-copy when writable."""
    src = as_byte_array(data)
    if src.nbytes != layout.block_bytes:
        cls = TooLargeError if src.nbytes > layout.block_bytes else BadRequestError
        raise cls(f"got {src.nbytes} bytes for a {layout.block_bytes}-byte block")
    shape = layout.host_shape(1)[1:]
    flat = torch.from_numpy(src if src.flags.writeable else src.copy())
    return flat.view(layout.torch_dtype).view(shape)


def writable_block(out: object, layout: KVLayout) -> torch.Tensor:
    """A writable buffer as a host block tensor [1, num_layers, 2, ...], without copying."""
    view = byte_view(out, writable=True, what="out")
    if view.nbytes < layout.block_bytes:
        raise TooLargeError(f"object of {layout.block_bytes} bytes > out buffer of {view.nbytes}")
    flat = torch.frombuffer(view, dtype=torch.uint8, count=layout.block_bytes)
    return flat.view(layout.torch_dtype).view(layout.host_shape(1))
