"""Run a tier's single-key put/get over many keys in parallel, one result per key."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from kvstore.errors import BadRequestError, CorruptError, NotReadyError
from kvstore.tiers.base import BytesLike
from kvstore.types import ObjectKey


class BatchRunner:
    """A thread pool that fans batch calls out key by key (I/O releases the GIL)."""

    def __init__(self, threads: int, name: str) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=name)

    def put_all(
        self,
        put: Callable[[ObjectKey, BytesLike], None],
        items: Sequence[tuple[ObjectKey, BytesLike]],
    ) -> list[Exception | None]:
        """None per stored item, or the exception its put raised."""

        def one(item: tuple[ObjectKey, BytesLike]) -> Exception | None:
            try:
                key, value = item
            except (TypeError, ValueError):
                return BadRequestError(f"batch item must be a (key, value) pair, got {item!r:.80}")
            try:
                put(key, value)
            except Exception as exc:
                return exc
            return None

        return list(self._pool.map(one, items))

    def get_all(
        self, get: Callable[[ObjectKey], bytes | None], keys: Sequence[ObjectKey]
    ) -> list[bytes | None]:
        """The bytes per key; None for absent, still being written, or corrupt."""

        def one(key: ObjectKey) -> bytes | None:
            try:
                return get(key)
            except (NotReadyError, CorruptError):
                return None

        return list(self._pool.map(one, keys))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
