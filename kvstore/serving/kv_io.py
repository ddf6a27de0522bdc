"""Moving KV blocks between a node's paged KV pool and the store.

Objects are one (block, layer) each: `<hash hex>/L<layer>` for a full prompt block,
`<tail key>/L<layer>` for the request-scoped partial last block. Per-layer objects
let a prefill node publish layer i of a chunk as soon as layer i is computed
(`KVPublisher`, a background thread), while layers i+1.. still compute (Splitwise's
layer-wise overlap). On a CPU pool the objects are read from and written into the
pool's tensors in place (zero-copy views); on CUDA they are staged through host
tensors with one gather/scatter per layer.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kvstore.errors import ExistsError, KVStoreError, UnavailableError
from kvstore.hashing import block_hashes
from kvstore.serving.store import BlockStore
from kvstore.types import block_key


def layer_key(block_hash: bytes, layer: int) -> str:
    return block_key(block_hash, f"L{layer}")


def tail_layer_key(tail_key: str, layer: int) -> str:
    return f"{tail_key}/L{layer}"


def byte_view(t: torch.Tensor) -> memoryview:
    """Writable byte view of a contiguous host tensor (no copy)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")


def layer_snapshot(layer: torch.Tensor, block_ids: Sequence[int]) -> list[torch.Tensor]:
    """Host tensors holding `layer[b]` for each block: views on cpu, one gather + copy
    on a device (so the bytes stay valid while later layers compute)."""
    if layer.device.type == "cpu":
        return [layer[b] for b in block_ids]
    idx = torch.tensor(list(block_ids), device=layer.device)
    host = torch.index_select(layer, 0, idx).to("cpu")
    return list(host.unbind(0))


def register_layers(store: BlockStore, kv_layers: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Register a host pool's layer tensors with the store (one registration each, not
    one per transfer); returns what to unregister. A device pool stages, so: nothing."""
    if not kv_layers or kv_layers[0].device.type != "cpu":
        return []
    for layer in kv_layers:
        store.register(layer)
    return list(kv_layers)


def unregister_layers(store: BlockStore, layers: Sequence[torch.Tensor]) -> None:
    for layer in layers:
        with contextlib.suppress(KVStoreError):
            store.unregister(layer)


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


def publish_sequence(
    store: BlockStore,
    kv_layers: Sequence[torch.Tensor],
    namespace: bytes,
    tokens: Sequence[int],
    block_ids: Sequence[int],
    skip: int,
) -> int:
    """Write the full blocks of `tokens` (KV in pool blocks `block_ids`) from block
    `skip` on, one batch per layer; returns the objects written (existing ones count)."""
    hashes = block_hashes(tokens, kv_layers[0].shape[2], namespace)[skip:]
    if not hashes:
        return 0
    ids = list(block_ids[skip : skip + len(hashes)])
    written = 0
    for i, layer in enumerate(kv_layers):
        keys = [layer_key(h, i) for h in hashes]
        views = [byte_view(t) for t in layer_snapshot(layer, ids)]
        results = store.batch_put_from(keys, views, hashes[0].hex())
        written += sum(r is None or isinstance(r, ExistsError) for r in results)
    return written


@dataclass(frozen=True, slots=True)
class PullResult:
    """Outcome of pulling blocks: how many leading blocks are complete, bytes read."""

    complete_blocks: int
    bytes: int
    first_error: KVStoreError | None


def pull_blocks(
    store: BlockStore,
    kv_layers: Sequence[torch.Tensor],
    keys_per_block: Sequence[Sequence[str]],
    block_ids: Sequence[int],
) -> PullResult:
    """Read each block's per-layer objects into pool blocks `block_ids` with one batched
    read; returns how many leading blocks arrived whole (the rest must be recomputed)."""
    if not keys_per_block:
        return PullResult(0, 0, None)
    on_cpu = kv_layers[0].device.type == "cpu"
    n_layers = len(kv_layers)
    staging = [
        kv_layers[i][b] if on_cpu else torch.empty_like(kv_layers[i][b], device="cpu")
        for b in block_ids
        for i in range(n_layers)
    ]
    keys = [k for block in keys_per_block for k in block]
    results = store.batch_get_into(keys, [byte_view(t) for t in staging])
    complete, error = _leading_complete(results, n_layers)
    if not on_cpu:
        _scatter(kv_layers, block_ids[:complete], staging[: complete * n_layers])
    size = staging[0].numel() * staging[0].element_size()
    return PullResult(complete, complete * n_layers * size, error)


def _leading_complete(
    results: Sequence[int | KVStoreError], n_layers: int
) -> tuple[int, KVStoreError | None]:
    for i, r in enumerate(results):
        if isinstance(r, KVStoreError):
            return i // n_layers, r
    return len(results) // n_layers, None


def _scatter(
    kv_layers: Sequence[torch.Tensor], block_ids: Sequence[int], staging: list[torch.Tensor]
) -> None:
    if not block_ids:
        return
    n_layers = len(kv_layers)
    idx = torch.tensor(list(block_ids), device=kv_layers[0].device)
    for i, layer in enumerate(kv_layers):
        host = torch.stack(staging[i::n_layers])
        layer.index_copy_(0, idx, host.to(layer.device))
