"""Moving KV blocks between a node's paged KV pool and the store.

A block is stored as one of two object shapes (`ServingConfig.kv_objects`):

- "layer": one object per (block, layer), `<ref>/L<i>`. A prefill node can publish
  layer i of a chunk as soon as layer i is computed, while layers i+1.. compute
  (Splitwise's layer-wise overlap). On a CPU pool objects are read from and written
  into the pool's tensors in place (zero-copy views).
- "block": one object per block, all layers, `<ref>`, in the block-major host layout
  of `HbmKVPool.offload`. num_layers times fewer objects (per-object overhead
  dominates small objects: 1,024 x 32 KiB puts take ~10x longer than 128 x 256 KiB
  here), published per chunk instead of per layer.

`<ref>` is the block's hash in hex for a full prompt block, or a request-scoped
tail key for the partial last block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvstore.errors import ExistsError, KVStoreError
from kvstore.hashing import block_hashes
from kvstore.serving.store import BlockStore
from kvstore.tiers.kv_pool import HbmKVPool


def object_keys(ref: str, num_layers: int, layered: bool) -> list[str]:
    """The store keys of one block, in layer order."""
    return [f"{ref}/L{i}" for i in range(num_layers)] if layered else [ref]


def byte_view(t: torch.Tensor) -> memoryview:
    """Writable byte view of a contiguous host tensor (no copy)."""
    return t.reshape(-1).view(torch.uint8).numpy().data.cast("B")


def snapshot(kv: HbmKVPool, block_ids: Sequence[int], layer: int | None) -> list[torch.Tensor]:
    """Host tensors with the bytes of one object per block: layer `layer` of it, or (None)
    the whole block. Layer views on a cpu pool are zero-copy; everything else is one
    gather + copy, so the bytes stay valid while the pool keeps changing."""
    if layer is None:
        return list(kv.offload(list(block_ids)).unbind(0))
    tensor = kv.layers[layer]
    if tensor.device.type == "cpu":
        return [tensor[b] for b in block_ids]
    idx = torch.tensor(list(block_ids), device=tensor.device)
    return list(torch.index_select(tensor, 0, idx).to("cpu").unbind(0))


def register_layers(store: BlockStore, kv: HbmKVPool) -> list[torch.Tensor]:
    """Register a host pool's layer tensors with the store (once, not per transfer);
    returns what to unregister. A device pool stages through host buffers: nothing."""
    if kv.device.type != "cpu":
        return []
    for layer in kv.layers:
        store.register(layer)
    return list(kv.layers)


def unregister_layers(store: BlockStore, layers: Sequence[torch.Tensor]) -> None:
    for layer in layers:
        with contextlib.suppress(KVStoreError):
            store.unregister(layer)


def publish_sequence(
    store: BlockStore,
    kv: HbmKVPool,
    namespace: bytes,
    tokens: Sequence[int],
    block_ids: Sequence[int],
    skip: int,
    layered: bool,
) -> int:
    """Write the full blocks of `tokens` (KV in pool blocks `block_ids`) from block
    `skip` on; returns the objects now in the store (existing ones count)."""
    hashes = block_hashes(tokens, kv.layout.block_tokens, namespace)[skip:]
    if not hashes:
        return 0
    ids = list(block_ids[skip : skip + len(hashes)])
    refs = [h.hex() for h in hashes]
    n_layers = kv.layout.num_layers
    written = 0
    for layer in range(n_layers) if layered else [None]:
        pick = 0 if layer is None else layer
        keys = [object_keys(r, n_layers, layered)[pick] for r in refs]
        views = [byte_view(t) for t in snapshot(kv, ids, layer)]
        results = store.batch_put_from(keys, views, refs[0])
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
    kv: HbmKVPool,
    refs: Sequence[str],
    block_ids: Sequence[int],
    layered: bool,
) -> PullResult:
    """Read the objects of blocks `refs` into pool blocks `block_ids` with one batched
    read; returns how many leading blocks arrived whole (the rest must be recomputed)."""
    if not refs:
        return PullResult(0, 0, None)
    n_layers = kv.layout.num_layers
    keys = [k for r in refs for k in object_keys(r, n_layers, layered)]
    if layered:
        targets = _layer_targets(kv, block_ids)
    else:
        host = kv.new_host_buffer(len(refs))
        targets = list(host.unbind(0))
    results = store.batch_get_into(keys, [byte_view(t) for t in targets])
    per_block = n_layers if layered else 1
    complete, error = _leading_complete(results, per_block)
    if complete and not layered:
        kv.onload(host[:complete], list(block_ids[:complete]))
    elif complete and kv.device.type != "cpu":
        _scatter(kv, block_ids[:complete], targets[: complete * n_layers])
    return PullResult(complete, complete * kv.layout.block_bytes, error)


def _layer_targets(kv: HbmKVPool, block_ids: Sequence[int]) -> list[torch.Tensor]:
    """Where each (block, layer) object lands: the pool itself on cpu, else host staging."""
    on_cpu = kv.device.type == "cpu"
    return [
        layer[b] if on_cpu else torch.empty_like(layer[b], device="cpu")
        for b in block_ids
        for layer in kv.layers
    ]


def _leading_complete(
    results: Sequence[int | KVStoreError], per_block: int
) -> tuple[int, KVStoreError | None]:
    for i, r in enumerate(results):
        if isinstance(r, KVStoreError):
            return i // per_block, r
    return len(results) // per_block, None


def _scatter(kv: HbmKVPool, block_ids: Sequence[int], staging: list[torch.Tensor]) -> None:
    """Per-layer host staging (block-major order) into the device pool."""
    n_layers = kv.layout.num_layers
    idx = torch.tensor(list(block_ids), device=kv.device)
    for i, layer in enumerate(kv.layers):
        layer.index_copy_(0, idx, torch.stack(staging[i::n_layers]).to(kv.device))
