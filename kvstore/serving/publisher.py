"""Background writer of KV objects: a prefill node hands it each computed piece and
keeps computing while it writes (Splitwise's layer-wise overlap)."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from kvstore.errors import ExistsError, KVStoreError, UnavailableError
from kvstore.serving.kv_io import byte_view
from kvstore.serving.store import BlockStore


@dataclass(slots=True)
class PublishStats:
    """What a publisher did: seconds inside store writes, bytes, objects, failures."""

    put_s: float = 0.0
    bytes: int = 0
    objects: int = 0
    errors: list[KVStoreError] = field(default_factory=list)


class KVPublisher:
    """Writes batches of objects to the store from a background thread, in order.

    `submit` returns at once; `flush` waits for everything submitted so far. A key
    that exists already (another request published the same block) is not an error.
    """

    def __init__(self, store: BlockStore, name: str = "kv-publisher") -> None:
        self.store = store
        self.stats = PublishStats()
        self._jobs: queue.Queue[tuple[list[str], list[torch.Tensor], str] | None] = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, keys: list[str], tensors: list[torch.Tensor], group: str = "") -> None:
        if not keys:
            return
        with self._idle:
            self._pending += 1
        self._jobs.put((keys, tensors, group))

    def flush(self, timeout_s: float) -> PublishStats:
        """Wait until every submitted batch is written; return the stats and reset them."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._pending == 0, timeout=timeout_s):
                raise UnavailableError(f"KV publishing did not finish within {timeout_s} s")
            stats, self.stats = self.stats, PublishStats()
        return stats

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            keys, tensors, group = job
            start = time.perf_counter()
            try:
                results = self.store.batch_put_from(keys, [byte_view(t) for t in tensors], group)
            except KVStoreError as exc:
                results = [exc] * len(keys)
            except Exception as exc:  # a store bug must not wedge flush()
                results = [KVStoreError(f"publish failed: {exc!r}")] * len(keys)
            with self._idle:
                self.stats.put_s += time.perf_counter() - start
                for t, err in zip(tensors, results, strict=True):
                    if err is None:
                        self.stats.objects += 1
                        self.stats.bytes += t.numel() * t.element_size()
                    elif not isinstance(err, ExistsError):
                        self.stats.errors.append(err)
                self._pending -= 1
                self._idle.notify_all()
