"""A Mooncake-compatible facade: `MooncakeDistributedStore` on top of `kvstore.Client`.

Same method names, arguments and integer return codes as `mooncake.store.
MooncakeDistributedStore` 0.3.13 (0 = success, negative = Mooncake's ErrorCode), so
the Mooncake connectors of vLLM, SGLang and LMCache run on kvstore by swapping the
import (or by putting kvstore's `mooncake.store` shim, kvstore/compat/shim, on
PYTHONPATH). Memory is passed as (address, size) integers, as in Mooncake. What
differs, method by method, is in docs/mooncake_compat.md.

    store = MooncakeDistributedStore()
    store.setup("127.0.0.1", "P2PHANDSHAKE", 512 << 20, 16 << 20, "tcp", "", "127.0.0.1:50051")
    store.register_buffer(ptr, size); store.put_from("k", ptr, n); store.get_into("k", ptr, n)
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from kvstore.compat.mooncake_codes import ErrorCode
from kvstore.compat.mooncake_config import ObjectDataType, ReplicateConfig, SoftPinAction
from kvstore.compat.mooncake_core import transport_for, view_at
from kvstore.compat.mooncake_multi import MultiBufferApi
from kvstore.compat.mooncake_parallel import ParallelismApi
from kvstore.compat.mooncake_pool import BufferLease, BufferPool
from kvstore.compat.mooncake_tensor import HEADER_BYTES
from kvstore.compat.mooncake_types import (
    BufferHandle,
    DiskDescriptor,
    MemoryDescriptor,
    ReplicaDescriptor,
    ReplicaStatus,
    TaskStatus,
    TaskType,
)

__all__ = [
    "BufferHandle", "BufferLease", "BufferPool", "DiskDescriptor", "ErrorCode",
    "MemoryDescriptor", "MooncakeDistributedStore", "ObjectDataType", "ReplicaDescriptor",
    "ReplicaStatus", "ReplicateConfig", "SoftPinAction", "TaskStatus", "TaskType",
    "_tensor_metadata_size", "get_alloc_func_addr", "get_free_func_addr", "transport_for",
    "view_at",
]  # fmt: skip
NOT_SUPPORTED = int(ErrorCode.NOT_SUPPORTED)


def _libc_address(name: str) -> int:
    return int(ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value or 0)


def get_alloc_func_addr() -> int:
    """Address of a C `void *alloc(size_t)` for buffers (Mooncake: hugepage alloc; here malloc)."""
    return _libc_address("malloc")


def get_free_func_addr() -> int:
    """Address of the C `void free(void *)` matching `get_alloc_func_addr`."""
    return _libc_address("free")


def _tensor_metadata_size() -> int:
    """Bytes before a stored tensor's data (Mooncake's helper of the same name, used by
    its structured object store to size `get_tensor_into` destinations)."""
    return HEADER_BYTES


class _Absent:
    """Mooncake methods kvstore does not offer: they return NOT_SUPPORTED (-1012) in the
    method's own result shape, never raise (docs/mooncake_compat.md says why each)."""

    # replica copy/move tasks: kvstore's master moves replicas itself (promotion, repair)
    def create_copy_task(self, key: str, targets: Sequence[str]) -> tuple[Any, int]:
        return (0, 0), NOT_SUPPORTED

    def create_move_task(self, key: str, source: str, target: str) -> tuple[Any, int]:
        return (0, 0), NOT_SUPPORTED

    def query_task(self, task_id: Any) -> tuple[Any, int]:
        return None, int(ErrorCode.TASK_NOT_FOUND)

    # segments: a kvstore segment is lent by `global_segment_size` or a `kvstore node`
    def mount_segment(self, path: str, size: int, offset: int = 0, protocol: str = "tcp",
                      location: str = "") -> dict[str, Any]:  # fmt: skip
        return {"error_code": NOT_SUPPORTED}

    def allocate_and_mount_segment(self, size: int, protocol: str = "tcp",
                                   location: str = "") -> dict[str, Any]:  # fmt: skip
        return {"error_code": NOT_SUPPORTED}

    def unmount_segment(self, segment_ids: Sequence[str], grace_period_seconds: int = 0) -> int:
        return NOT_SUPPORTED

    def unmount_and_free_segment(self, segment_ids: Sequence[str],
                                 grace_period_seconds: int = 0) -> int:  # fmt: skip
        return NOT_SUPPORTED

    def unmount_local_disk_segment(self, grace_period_seconds: int = 0) -> int:
        return NOT_SUPPORTED

    # put/get sessions (two-phase writes of Mooncake's master): kvstore commits in one call
    def batch_put_session_start(self, keys: Sequence[str], sizes: Sequence[int],
                                config: object = None) -> list[int]:  # fmt: skip
        return [NOT_SUPPORTED] * len(keys)

    def batch_put_session_end(self, keys: Sequence[str]) -> list[int]:
        return [NOT_SUPPORTED] * len(keys)

    def batch_put_session_revoke(self, keys: Sequence[str]) -> list[int]:
        return [NOT_SUPPORTED] * len(keys)

    def batch_get_session_start(self, keys: Sequence[str]) -> list[int]:
        return [NOT_SUPPORTED] * len(keys)

    def batch_get_session_end(self, keys: Sequence[str]) -> int:
        return NOT_SUPPORTED


def _not_supported_list(self: Any, keys: Sequence[str], *args: Any, **kwargs: Any) -> list[int]:
    return [NOT_SUPPORTED] * len(keys)


def _not_supported_one(self: Any, key: str, *args: Any, **kwargs: Any) -> int:
    return NOT_SUPPORTED


# CUDA-tensor forms: not offered (see the docs). The parallelism forms
# serve their whole-object route only (mooncake_parallel.py).
_ABSENT_FORMS: dict[str, Any] = {
    "get_tensor_into_cuda": _not_supported_one,
    "batch_get_tensor_into_cuda": _not_supported_list,
}


class MooncakeDistributedStore(ParallelismApi, MultiBufferApi, _Absent):
    """Mooncake Store's Python API over kvstore. Every method returns, never raises."""


for _name, _fn in _ABSENT_FORMS.items():
    setattr(MooncakeDistributedStore, _name, _fn)

Descriptor = ReplicaDescriptor
# pybind exports enum members at module level too (mooncake.store.COMPLETE, ...)
globals().update({m.name: m for e in (ObjectDataType, ReplicaStatus, TaskStatus, TaskType)
                  for m in e})  # fmt: skip


def bind_to_numa_node(node: int) -> None:
    """Accepted and ignored: kvstore leaves NUMA placement to the OS."""
