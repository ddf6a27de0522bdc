"""The tensor API of the Mooncake facade: put/get/upsert/pub of torch tensors, their
batch, `*_from`/`*_into` (an encoded tensor in a registered buffer) and `_with_tp`
forms. Encoding: mooncake_tensor.py. A missing or undecodable object reads as None;
writes return Mooncake codes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from kvstore.compat import mooncake_tensor as mt
from kvstore.compat.mooncake_codes import ErrorCode, code_of
from kvstore.compat.mooncake_core import BAD, NOT_READY, OK, StoreCore, view_at
from kvstore.errors import KVStoreError

log = logging.getLogger(__name__)


class TensorApi(StoreCore):
    """Tensors stored as single objects (header + bytes), TP shards as `<key>_tp_<i>`."""

    # -- writes -----------------------------------------------------------------

    def _put_tensors(self, keys: Sequence[str], tensors: Sequence[Any], config: object,
                     upsert: bool) -> list[int]:  # fmt: skip
        if len(keys) != len(tensors):
            return [BAD] * len(keys)

        def encoded() -> list[memoryview]:
            return [self._staged_view(mt.encode(t)) for t in tensors]

        return self._batch(keys, encoded, config, upsert)

    def put_tensor(self, key: str, tensor: Any) -> int:
        return self._put_tensors([key], [tensor], None, False)[0]

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        return self._put_tensors([key], [tensor], None, True)[0]

    def pub_tensor(self, key: str, tensor: Any, config: object = None) -> int:
        """put_tensor with a ReplicateConfig (replicas, pins)."""
        return self._put_tensors([key], [tensor], config, False)[0]

    def upsert_pub_tensor(self, key: str, tensor: Any, config: object = None) -> int:
        return self._put_tensors([key], [tensor], config, True)[0]

    def batch_put_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        return self._put_tensors(keys, tensors_list, None, False)

    def batch_upsert_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        return self._put_tensors(keys, tensors_list, None, True)

    def batch_pub_tensor(
        self, keys: Sequence[str], tensors_list: Sequence[Any], config: object = None
    ) -> list[int]:
        return self._put_tensors(keys, tensors_list, config, False)

    def batch_upsert_pub_tensor(
        self, keys: Sequence[str], tensors_list: Sequence[Any], config: object = None
    ) -> list[int]:
        return self._put_tensors(keys, tensors_list, config, True)

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Store an encoded tensor lying in (buffer_ptr, size) (checked: -600 if not one)."""
        return self.batch_put_tensor_from([key], [buffer_ptr], [size])[0]

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self.batch_upsert_tensor_from([key], [buffer_ptr], [size])[0]

    def batch_put_tensor_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        return self._tensor_from(keys, buffer_ptrs, sizes, False)

    def batch_upsert_tensor_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        return self._tensor_from(keys, buffer_ptrs, sizes, True)

    def _tensor_from(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int],
                     upsert: bool, config: object = None) -> list[int]:  # fmt: skip
        if not len(keys) == len(ptrs) == len(sizes):
            return [BAD] * len(keys)
        for p, s in zip(ptrs, sizes, strict=True):
            try:
                mt.decode(view_at(p, s))
            except (KVStoreError, TypeError, ValueError):
                return [BAD] * len(keys)
        return self._batch_from(keys, ptrs, sizes, config, upsert)

    # -- reads ------------------------------------------------------------------

    def get_tensor(self, key: str) -> Any:
        return self.batch_get_tensor([key])[0]

    def batch_get_tensor(self, keys: Sequence[str]) -> list[Any]:
        """A tensor per key (it owns its memory); None where absent or not a tensor."""
        return [_decoded(h) for h in self.batch_get_buffer(keys)]

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        return self.batch_get_tensor_into([key], [buffer_ptr], [size])[0]

    def batch_get_tensor_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[Any]:
        """Read each encoded tensor into its buffer; a tensor viewing that buffer, or None.
        As Mooncake, a call it cannot start (list lengths differ, a null buffer) is a
        code per key instead: -600 (-1010 before setup)."""
        if self._client is None:
            return [NOT_READY] * len(keys)
        if not len(keys) == len(buffer_ptrs) == len(sizes) or not all(buffer_ptrs):
            return [BAD] * len(keys)
        results = self.batch_get_into(keys, buffer_ptrs, sizes)
        return [_decoded(view_at(ptr, n)) if n > 0 else None
                for ptr, n in zip(buffer_ptrs, results, strict=True)]  # fmt: skip

    # -- safetensors files (Mooncake's store_py.cpp does the same through safetensors.torch)

    def save_tensor_to_safetensor(self, key: str, file_name: str | None = None) -> int:
        """Write the tensor stored under `key` to the safetensors file `file_name` (default:
        the key), as its one entry named `key`. 0; -600 before setup or when the file cannot
        be written; -1100 FILE_NOT_FOUND when `key` holds no tensor (Mooncake's codes)."""
        if self._client is None:
            return BAD
        tensor = self.get_tensor(key)
        if tensor is None:
            return int(ErrorCode.FILE_NOT_FOUND)
        try:
            from safetensors.torch import save_file

            save_file({key: tensor.contiguous()}, key if file_name is None else str(file_name))
        except Exception as exc:  # a code, never an exception (as Mooncake)
            log.error("save_tensor_to_safetensor(%r) failed: %s", key, exc)
            return BAD
        return OK

    def load_tensor_from_safetensor(self, key: str | None = None,
                                    file_name: str | None = None) -> Any:  # fmt: skip
        """Read a safetensors file and put_tensor its entry named `key` (the first entry if
        none is; `key` None: the first entry, stored under `file_name`). The tensor, or None
        (before setup, unreadable or empty file, failed put)."""
        if self._client is None or file_name is None:
            return None
        try:
            from safetensors.torch import load_file

            loaded = load_file(str(file_name))
        except Exception as exc:  # None, never an exception (as Mooncake)
            log.error("load_tensor_from_safetensor(%r) failed: %s", file_name, exc)
            return None
        if not loaded:
            log.error("no tensors in safetensors file %r", file_name)
            return None
        target = str(file_name) if key is None else key
        if key is not None and key not in loaded:
            log.warning("%r not in safetensors file %r; using its first entry", key, file_name)
        tensor = loaded[key] if key is not None and key in loaded else next(iter(loaded.values()))
        rc = self.put_tensor(target, tensor)
        if rc != OK:
            log.error("load_tensor_from_safetensor: put_tensor(%r) returned %d", target, rc)
            return None
        return tensor

    # -- tensor parallel --------------------------------------------------------

    def put_tensor_with_tp(self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> int:  # fmt: skip
        return self.batch_put_tensor_with_tp([key], [tensor], tp_rank, tp_size, split_dim)[0]

    def pub_tensor_with_tp(self, key: str, tensor: Any, config: object = None, tp_rank: int = 0,
                           tp_size: int = 1, split_dim: int = 0) -> int:  # fmt: skip
        return self._put_tp([key], [tensor], config, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp(self, base_keys: Sequence[str], tensors_list: Sequence[Any],
                                 tp_rank: int = 0, tp_size: int = 1,
                                 split_dim: int = 0) -> list[int]:  # fmt: skip
        """Split each tensor into `tp_size` shards along `split_dim`, all stored (as
        Mooncake's writer does), shard i under `<key>_tp_<i>`; a code per base key."""
        return self._put_tp(base_keys, tensors_list, None, tp_size, split_dim)

    def batch_pub_tensor_with_tp(self, base_keys: Sequence[str], tensors_list: Sequence[Any],
                                 config: object = None, tp_rank: int = 0, tp_size: int = 1,
                                 split_dim: int = 0) -> list[int]:  # fmt: skip
        return self._put_tp(base_keys, tensors_list, config, tp_size, split_dim)

    def _put_tp(self, keys: Sequence[str], tensors: Sequence[Any], config: object,
                tp_size: int, split_dim: int) -> list[int]:  # fmt: skip
        if len(keys) != len(tensors):
            return [BAD] * len(keys)
        out = []
        for key, tensor in zip(keys, tensors, strict=True):
            try:
                parts = mt.shards(tensor, tp_size, split_dim)
            except KVStoreError as exc:
                out.append(code_of(exc))
                continue
            keys_i = [mt.tp_key(key, i) for i in range(tp_size)] if tp_size > 1 else [key]
            codes = self._put_tensors(keys_i, parts, config, False)
            out.append(next((c for c in codes if c), OK))
        return out

    def put_tensor_with_tp_from(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0,
                                tp_size: int = 1, split_dim: int = 0) -> int:  # fmt: skip
        return self.batch_put_tensor_with_tp_from([key], [buffer_ptr], [size], tp_rank, tp_size,
                                                  split_dim)[0]  # fmt: skip

    def batch_put_tensor_with_tp_from(self, base_keys: Sequence[str], buffer_ptrs: Sequence[int],
                                      sizes: Sequence[int], tp_rank: int = 0, tp_size: int = 1,
                                      split_dim: int = 0) -> list[int]:  # fmt: skip
        """The encoded tensor in each buffer, split and stored as with put_tensor_with_tp."""
        if not len(base_keys) == len(buffer_ptrs) == len(sizes):
            return [BAD] * len(base_keys)
        tensors = []
        for p, s in zip(buffer_ptrs, sizes, strict=True):
            t = _decoded(view_at(p, s)) if p and s > 0 else None
            if t is None:
                return [BAD] * len(base_keys)
            tensors.append(t)
        return self._put_tp(base_keys, tensors, None, tp_size, split_dim)

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> Any:  # fmt: skip
        return self.get_tensor(mt.tp_key(key, tp_rank) if tp_size > 1 else key)

    def batch_get_tensor_with_tp(self, base_keys: Sequence[str], tp_rank: int = 0,
                                 tp_size: int = 1) -> list[Any]:  # fmt: skip
        return self.batch_get_tensor(self._tp_keys(base_keys, tp_rank, tp_size))

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0,
                                tp_size: int = 1, split_dim: int = 0) -> Any:  # fmt: skip
        return self.get_tensor_into(mt.tp_key(key, tp_rank) if tp_size > 1 else key,
                                    buffer_ptr, size)  # fmt: skip

    def batch_get_tensor_with_tp_into(self, base_keys: Sequence[str], buffer_ptrs: Sequence[int],
                                      sizes: Sequence[int], tp_rank: int = 0,
                                      tp_size: int = 1) -> list[Any]:  # fmt: skip
        keys = self._tp_keys(base_keys, tp_rank, tp_size)
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    @staticmethod
    def _tp_keys(keys: Sequence[str], rank: int, size: int) -> list[str]:
        return [mt.tp_key(k, rank) if size > 1 else k for k in keys]


def _decoded(raw: Any) -> Any:
    if raw is None:
        return None
    try:
        return mt.decode(raw)
    except (KVStoreError, TypeError, ValueError):
        return None
