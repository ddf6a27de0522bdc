"""Block identity: chained prefix hashes over full blocks of token ids.

    h_{-1} = xxh3_128(b"kvstore/v1\\0" || namespace)
    h_i    = xxh3_128(h_{i-1} || tokens of block i as u32 little-endian)

Equal hashes mean equal prefixes up to and including that block, under the same
namespace. The namespace carries everything that makes KV bytes differ for the
same tokens: model id, tenant salt, KV dtype and layout, tensor-parallel rank
(`make_namespace`). Only full blocks are hashed: a partial last block gets none.
Python's `hash()` is never used: these hashes are stable across processes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

import numpy as np
import xxhash

from kvstore.errors import BadRequestError
from kvstore.types import BlockHash

HASH_BYTES = 16
_ROOT_TAG = b"kvstore/v1\0"
_MAX_TOKEN = 2**32 - 1


def make_namespace(
    model_id: str,
    *,
    tenant: str = "",
    kv_dtype: str = "",
    kv_layout: str = "",
    tp_rank: int = 0,
    tp_size: int = 1,
) -> bytes:
    """Build the namespace bytes that seed a chain; any field change gives new hashes."""
    if not model_id:
        raise BadRequestError("model_id must not be empty")
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise BadRequestError(f"bad tensor-parallel rank {tp_rank}/{tp_size}")
    fields = (model_id, tenant, kv_dtype, kv_layout, str(tp_rank), str(tp_size))
    return b"".join(struct.pack("<I", len(f.encode())) + f.encode() for f in fields)


def root_hash(namespace: bytes = b"") -> BlockHash:
    """h_{-1}: the seed of every chain in this namespace."""
    return BlockHash(xxhash.xxh3_128_digest(_ROOT_TAG + bytes(namespace)))


def block_hashes(token_ids: Sequence[int], block_size: int, namespace: bytes = b"") -> list[bytes]:
    """Chained hashes of the full blocks of `token_ids` (a partial last block is skipped)."""
    return [bytes(h) for h in extend_hashes(root_hash(namespace), token_ids, block_size)]


def extend_hashes(parent: bytes, token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """Continue a chain from `parent` over the full blocks of `token_ids`."""
    if not isinstance(block_size, int) or block_size <= 0:
        raise BadRequestError(f"block_size must be a positive int, got {block_size!r}")
    tokens = _as_u32(token_ids)
    out: list[BlockHash] = []
    prev = bytes(parent)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        prev = xxhash.xxh3_128_digest(prev + tokens[start : start + block_size].tobytes())
        out.append(BlockHash(prev))
    return out


def longest_cached_prefix(
    hashes: Sequence[bytes], batch_exists: Callable[[Sequence[bytes]], Sequence[bool]]
) -> int:
    """Number of leading blocks present, asking `batch_exists` once for all of them."""
    if not hashes:
        return 0
    present = batch_exists(hashes)
    if len(present) != len(hashes):
        raise BadRequestError("batch_exists returned a result count unlike the query")
    for i, hit in enumerate(present):
        if not hit:
            return i
    return len(hashes)


def _as_u32(token_ids: Sequence[int]) -> np.ndarray:
    arr = np.asarray(token_ids)
    if arr.ndim != 1:
        raise BadRequestError("token_ids must be a flat sequence of ints")
    if arr.size == 0:
        return np.zeros(0, dtype="<u4")
    if not np.issubdtype(arr.dtype, np.integer):
        raise BadRequestError(f"token ids must be ints, got dtype {arr.dtype}")
    if int(arr.min()) < 0 or int(arr.max()) > _MAX_TOKEN:
        raise BadRequestError("token ids must fit in u32")
    return arr.astype("<u4", copy=False)


# -- vLLM-compatible block identity (kvstore.hashing_vllm) --------------------------
# kvstore's own chain above is unchanged; `scheme="vllm"` reproduces vLLM's hashes
# (its sha256 / sha256_cbor / xxhash / xxhash_cbor, NONE_HASH seed, LoRA and
# cache_salt extra keys) so the conductor can index what a vLLM fleet holds.


def block_hashes_for(
    token_ids: Sequence[int], block_size: int, scheme: str = "kvstore", **options: object
) -> list[bytes]:
    """Block hashes under `scheme`: "kvstore" (namespace=...) or "vllm" (algorithm=,
    seed=, lora=, cache_salt=: see kvstore.hashing_vllm.block_hashes)."""
    if scheme == "kvstore":
        return block_hashes(token_ids, block_size, **options)  # type: ignore[arg-type]
    if scheme == "vllm":
        from kvstore import hashing_vllm

        return hashing_vllm.block_hashes(token_ids, block_size, **options)  # type: ignore[arg-type]
    raise BadRequestError(f"unknown hash scheme {scheme!r}: 'kvstore' or 'vllm'")
