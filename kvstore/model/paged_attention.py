"""Paged KV cache in the HBM tier's layout, and attention over it.

One tensor per layer, shaped [num_blocks, 2, block_tokens, kv_heads, head_dim]
(index 0 of dim 1 is K, 1 is V) — exactly `HbmKVPool.layers`, so a node passes the
pool's tensors straight in. A sequence owns a block table (block ids, in token
order); token at position p lives in block table[p // block_tokens], slot
p % block_tokens. Writes are plain copies, so KV bytes are whatever the projections
produced: bit-exact, and a block loaded from the store is indistinguishable from one
computed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvstore.errors import BadRequestError
from kvstore.model.config import ModelConfig


@dataclass(frozen=True, slots=True)
class CacheShape:
    """What a validated list of per-layer KV tensors holds."""

    num_blocks: int
    block_tokens: int


def allocate_kv_cache(
    config: ModelConfig,
    num_blocks: int,
    block_tokens: int,
    device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    """Zeroed per-layer KV tensors in the HBM layout (for tests and colocated runs)."""
    if num_blocks <= 0 or block_tokens <= 0:
        raise BadRequestError(f"bad cache size: {num_blocks} blocks x {block_tokens} tokens")
    shape = (num_blocks, 2, block_tokens, config.kv_heads, config.head_dim)
    return [
        torch.zeros(shape, dtype=config.torch_dtype, device=device) for _ in range(config.layers)
    ]


def check_kv_cache(
    config: ModelConfig, kv_layers: Sequence[torch.Tensor], device: torch.device
) -> CacheShape:
    """Validate layer count, shape, dtype and device; return blocks and block size."""
    if len(kv_layers) != config.layers:
        raise BadRequestError(f"kv_layers has {len(kv_layers)} layers, model has {config.layers}")
    first = kv_layers[0]
    for i, t in enumerate(kv_layers):
        bad_shape = t.dim() != 5 or t.shape[1] != 2 or t.shape[3:] != first.shape[3:]
        if bad_shape or t.shape != first.shape:
            raise BadRequestError(f"kv_layers[{i}] has shape {tuple(t.shape)}")
        if t.dtype != config.torch_dtype or t.device != device:
            raise BadRequestError(f"kv_layers[{i}] is {t.dtype} on {t.device}")
    if tuple(first.shape[3:]) != (config.kv_heads, config.head_dim):
        raise BadRequestError(
            f"kv_layers heads/dim {tuple(first.shape[3:])} != "
            f"model ({config.kv_heads}, {config.head_dim})"
        )
    return CacheShape(num_blocks=first.shape[0], block_tokens=first.shape[2])


def check_block_table(block_table: Sequence[int], end_pos: int, cache: CacheShape) -> list[int]:
    """The prefix of the table that covers positions 0..end_pos-1, validated."""
    needed = -(-end_pos // cache.block_tokens)
    if len(block_table) < needed:
        raise BadRequestError(
            f"block table has {len(block_table)} blocks; {end_pos} positions need {needed}"
        )
    table = [int(b) for b in block_table[:needed]]
    for b in table:
        if not 0 <= b < cache.num_blocks:
            raise BadRequestError(f"block id {b} outside cache of {cache.num_blocks} blocks")
    return table


def slot_mapping(
    table: torch.Tensor, positions: torch.Tensor, block_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(block ids, offsets within the block) of each position."""
    return table[positions // block_tokens], positions % block_tokens


def write_kv(
    kv_layer: torch.Tensor,
    blocks: torch.Tensor,
    offsets: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Store k, v [n, kv_heads, d] of n tokens into their slots of one layer."""
    kv_layer[blocks, 0, offsets] = k.to(kv_layer.dtype)
    kv_layer[blocks, 1, offsets] = v.to(kv_layer.dtype)


def gather_kv(
    kv_layer: torch.Tensor, table: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [length, kv_heads, d] of one sequence's first `length` tokens."""
    blocks = kv_layer[table]  # [nb, 2, bt, h, d]
    k = blocks[:, 0].flatten(0, 1)[:length]
    v = blocks[:, 1].flatten(0, 1)[:length]
    return k, v


def paged_attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor
) -> torch.Tensor:
    """Causal GQA attention of q [n, heads, d] over one sequence's keys [L, kv_heads, d].

    Query i sees keys 0..q_positions[i]; computed in float32, returned in q's dtype.
    """
    n, heads, d = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    # [kv_heads, group * n, d]: the queries sharing one KV head, side by side
    qg = q.float().view(n, kv_heads, group, d).permute(1, 2, 0, 3).reshape(kv_heads, group * n, d)
    kt = k.float().permute(1, 2, 0)  # [kv_heads, d, L]
    scores = torch.bmm(qg, kt) * (d**-0.5)  # [kv_heads, group * n, L]
    key_pos = torch.arange(k.shape[0], device=q.device)
    visible = key_pos[None, :] <= q_positions[:, None]  # [n, L]
    scores = scores.masked_fill(~visible.repeat(group, 1)[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.bmm(probs, v.float().transpose(0, 1))  # [kv_heads, group * n, d]
    out = out.view(kv_heads, group, n, d).permute(2, 0, 1, 3).reshape(n, heads, d)
    return out.to(q.dtype)
