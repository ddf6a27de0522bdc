"""Mooncake's `*_tensor_with_parallelism*` forms, as far as the facade offers them.

Called without a `parallelism` / `writer_partition` (writes) or `target` (reads),
Mooncake takes its "direct full object" route: the tensor is stored, or read, whole
under its key, exactly as `put_tensor` / `get_tensor` (with the call's ReplicateConfig).
That route is served here. A parallelism spec, a writer partition or a read target
(Mooncake's unified parallel tensor IO: shard keys, manifests, reconstruction) is not
built: writes return -1012 NOT_SUPPORTED per key, reads None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstore.compat.mooncake_codes import ErrorCode
from kvstore.compat.mooncake_core import BAD
from kvstore.compat.mooncake_tensor_api import TensorApi

NOT_SUPPORTED = int(ErrorCode.NOT_SUPPORTED)


def _direct(*specs: object) -> bool:
    """Whether a call names no parallelism / writer partition / target (the whole object)."""
    return all(s is None for s in specs)


class ParallelismApi(TensorApi):
    """The direct (whole-object) route of the parallelism forms; others NOT_SUPPORTED."""

    # -- writes -----------------------------------------------------------------

    def _parallel_put(self, keys: Sequence[str], tensors: Sequence[Any], specs: object,
                      partitions: object, config: object, upsert: bool) -> list[int]:  # fmt: skip
        if not _direct(specs, partitions):
            return [NOT_SUPPORTED] * len(keys)
        if len(keys) != len(tensors):
            return [BAD] * len(keys)
        return self._put_tensors(keys, tensors, config, upsert)

    def _parallel_from(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int],
                       specs: object, partitions: object, config: object,
                       upsert: bool) -> list[int]:  # fmt: skip
        if not _direct(specs, partitions):
            return [NOT_SUPPORTED] * len(keys)
        return self._tensor_from(keys, ptrs, sizes, upsert, config)

    def put_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: object = None,
                                    config: object = None,
                                    writer_partition: object = None) -> int:  # fmt: skip
        return self._parallel_put([key], [tensor], parallelism, writer_partition, config,
                                  False)[0]  # fmt: skip

    def upsert_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: object = None,
                                       config: object = None,
                                       writer_partition: object = None) -> int:  # fmt: skip
        return self._parallel_put([key], [tensor], parallelism, writer_partition, config,
                                  True)[0]  # fmt: skip

    def batch_put_tensor_with_parallelism(
        self, keys: Sequence[str], tensors_list: Sequence[Any], parallelisms: object = None,
        config: object = None, writer_partitions: object = None,
    ) -> list[int]:  # fmt: skip
        return self._parallel_put(keys, tensors_list, parallelisms, writer_partitions, config,
                                  False)  # fmt: skip

    def batch_upsert_tensor_with_parallelism(
        self, keys: Sequence[str], tensors_list: Sequence[Any], parallelisms: object = None,
        config: object = None, writer_partitions: object = None,
    ) -> list[int]:  # fmt: skip
        return self._parallel_put(keys, tensors_list, parallelisms, writer_partitions, config,
                                  True)  # fmt: skip

    def put_tensor_with_parallelism_from(
        self, key: str, buffer_ptr: int, size: int, parallelism: object = None,
        config: object = None, writer_partition: object = None,
    ) -> int:  # fmt: skip
        return self._parallel_from([key], [buffer_ptr], [size], parallelism, writer_partition,
                                   config, False)[0]  # fmt: skip

    def upsert_tensor_with_parallelism_from(
        self, key: str, buffer_ptr: int, size: int, parallelism: object = None,
        config: object = None, writer_partition: object = None,
    ) -> int:  # fmt: skip
        return self._parallel_from([key], [buffer_ptr], [size], parallelism, writer_partition,
                                   config, True)[0]  # fmt: skip

    def batch_put_tensor_with_parallelism_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int],
        parallelisms: object = None, config: object = None, writer_partitions: object = None,
    ) -> list[int]:  # fmt: skip
        return self._parallel_from(keys, buffer_ptrs, sizes, parallelisms, writer_partitions,
                                   config, False)  # fmt: skip

    def batch_upsert_tensor_with_parallelism_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int],
        parallelisms: object = None, config: object = None, writer_partitions: object = None,
    ) -> list[int]:  # fmt: skip
        return self._parallel_from(keys, buffer_ptrs, sizes, parallelisms, writer_partitions,
                                   config, True)  # fmt: skip

    # -- reads ------------------------------------------------------------------

    def get_tensor_with_parallelism(self, key: str, target: object = None) -> Any:
        return self.get_tensor(key) if _direct(target) else None

    def batch_get_tensor_with_parallelism(self, keys: Sequence[str],
                                          targets: object = None) -> list[Any]:  # fmt: skip
        return self.batch_get_tensor(keys) if _direct(targets) else [None] * len(keys)

    def get_tensor_with_parallelism_into(self, key: str, buffer_ptr: int, size: int,
                                         target: object = None) -> Any:  # fmt: skip
        return self.get_tensor_into(key, buffer_ptr, size) if _direct(target) else None

    def batch_get_tensor_with_parallelism_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int],
        targets: object = None,
    ) -> list[Any]:  # fmt: skip
        if not _direct(targets):
            return [None] * len(keys)
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)
