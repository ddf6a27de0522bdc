"""The small store interface the serving nodes need, and its two adapters.

`BlockStore` is what prefill and decode code call: batched existence, prefix
match, zero-copy batched reads and writes, removal. `PoolBlockStore` wraps the
pooled `kvstore.client.Client` (one-sided reads/writes across processes);
`LocalBlockStore` wraps an in-process `TieredStore` (HBM/DRAM/SSD tiers), for a
single node or for tests. Batched calls return one result per key: None or an int
on success, a KVStoreError otherwise; they raise only for whole-call faults.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from kvstore.errors import KVStoreError, NotFoundError
from kvstore.tiers.tiered import TieredStore
from kvstore.types import ObjectKey


@runtime_checkable
class BlockStore(Protocol):
    def batch_exists(self, keys: Sequence[str]) -> list[bool]: ...

    def match_prefix(self, keys: Sequence[str]) -> int:
        """Number of leading keys present."""
        ...

    def batch_get_into(
        self, keys: Sequence[str], outs: Sequence[memoryview]
    ) -> list[int | KVStoreError]: ...

    def batch_put_from(
        self, keys: Sequence[str], buffers: Sequence[memoryview], group: str = ""
    ) -> list[KVStoreError | None]: ...

    def remove(self, key: str) -> bool: ...

    def register(self, buffer: object) -> None:
        """Make `buffer` (and its slices) a zero-copy source/target of transfers."""
        ...

    def unregister(self, buffer: object) -> None: ...

    def close(self) -> None: ...


class LocalBlockStore:
    """BlockStore over an in-process TieredStore (copies bytes in and out)."""

    def __init__(self, store: TieredStore) -> None:
        self.store = store
        # One call at a time: a batched call visits the tiers one by one, and an object
        # demoted between two visits would be missed.
        self._lock = threading.Lock()

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        with self._lock:
            return self.store.batch_exists([ObjectKey(k) for k in keys])

    def match_prefix(self, keys: Sequence[str]) -> int:
        for i, hit in enumerate(self.batch_exists(keys)):
            if not hit:
                return i
        return len(keys)

    def batch_get_into(
        self, keys: Sequence[str], outs: Sequence[memoryview]
    ) -> list[int | KVStoreError]:
        with self._lock:
            got = self.store.batch_get_into([ObjectKey(k) for k in keys], outs)
        return [_as_result(k, r) for k, r in zip(keys, got, strict=True)]

    def batch_put_from(
        self, keys: Sequence[str], buffers: Sequence[memoryview], group: str = ""
    ) -> list[KVStoreError | None]:
        items = [(ObjectKey(k), b) for k, b in zip(keys, buffers, strict=True)]
        with self._lock:
            results = self.store.batch_put(items)
        return [r if isinstance(r, KVStoreError) or r is None else KVStoreError(r) for r in results]

    def remove(self, key: str) -> bool:
        with self._lock:
            return self.store.remove(ObjectKey(key))

    def register(self, buffer: object) -> None:
        """Nothing to do: in-process tiers copy from and into any buffer."""

    def unregister(self, buffer: object) -> None:
        """Nothing to do (see `register`)."""

    def close(self) -> None:
        self.store.close()


class PoolBlockStore:
    """BlockStore over the pooled client (kvstore.client.Client)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    @classmethod
    def connect(cls, master: str, **options: Any) -> PoolBlockStore:
        from kvstore.client import Client

        return cls(Client(master, **options))

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        return list(self.client.batch_exists(list(keys)))

    def match_prefix(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        return int(self.client.match_prefix(list(keys)).pool_length)

    def batch_get_into(
        self, keys: Sequence[str], outs: Sequence[memoryview]
    ) -> list[int | KVStoreError]:
        return list(self.client.batch_get_into(list(keys), list(outs)))

    def batch_put_from(
        self, keys: Sequence[str], buffers: Sequence[memoryview], group: str = ""
    ) -> list[KVStoreError | None]:
        return list(self.client.batch_put_from(list(keys), list(buffers), group=group))

    def remove(self, key: str) -> bool:
        """Forced: serving code removes only request-scoped keys it owns (a tail it just
        read is still under its own read lease)."""
        return bool(self.client.remove(key, force=True))

    def register(self, buffer: object) -> None:
        self.client.register_buffer(buffer)

    def unregister(self, buffer: object) -> None:
        self.client.unregister_buffer(buffer)

    def close(self) -> None:
        self.client.close()


def _as_result(key: str, result: object) -> int | KVStoreError:
    if isinstance(result, int):
        return result
    if isinstance(result, KVStoreError):
        return result
    if result is None:
        return NotFoundError(f"{key!r} not in the store")
    return KVStoreError(f"{key!r}: {result}")
