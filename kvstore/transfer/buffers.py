"""Turn user memory into a flat, writable, C-contiguous byte memoryview (no copy).

Accepts bytearray, memoryview, mmap, numpy arrays and CPU torch tensors; torch is
never imported here (a tensor is recognised by its module and viewed via numpy).
"""

from __future__ import annotations

import mmap

from kvstore.errors import BadRequestError


def _is_torch_tensor(obj: object) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _torch_view(tensor: object) -> memoryview:
    device = str(getattr(tensor, "device", "cpu"))
    if device != "cpu":
        raise BadRequestError(f"only CPU tensors can be registered here, got {device}")
    if not tensor.is_contiguous():  # type: ignore[attr-defined]
        raise BadRequestError("tensor must be contiguous")
    flat = tensor.detach().reshape(-1).view(-1)  # type: ignore[attr-defined]
    import torch  # lazy: only when a tensor was passed

    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def as_byte_view(buffer: object) -> memoryview:
    """A flat writable byte view of `buffer` sharing its memory; BadRequestError if not
    writable, not contiguous or not a buffer."""
    if _is_torch_tensor(buffer):
        return _torch_view(buffer)
    if isinstance(buffer, bytes):
        raise BadRequestError("bytes are read-only; register a bytearray or a writable view")
    if not isinstance(buffer, bytearray | memoryview | mmap.mmap) and not hasattr(
        buffer, "__array_interface__"
    ):
        raise BadRequestError(f"cannot register {type(buffer).__name__} as a buffer")
    try:
        view = memoryview(buffer)  # type: ignore[arg-type]
    except TypeError as e:
        raise BadRequestError(f"not a buffer: {e}") from e
    if view.readonly:
        raise BadRequestError("buffer is read-only")
    if not view.c_contiguous:
        raise BadRequestError("buffer must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view
