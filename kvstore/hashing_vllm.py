"""vLLM's prefix-cache block hashes, reproduced, so kvstore can index a vLLM fleet.

vLLM (v1, 0.32) hashes block i as

    h_i = H((h_{i-1}, tuple(tokens of block i), extra_keys_i))    h_{-1} = NONE_HASH
    NONE_HASH = H(seed)

where H serializes its argument with pickle (protocol 5) or canonical CBOR and
digests it with SHA-256 or xxh3-128 ("sha256", "sha256_cbor", "xxhash",
"xxhash_cbor"). The seed is $PYTHONHASHSEED when set, else "vllm-none-hash" for
the SHA-256 variants; the xxhash variants draw a random per-process seed unless
PYTHONHASHSEED is set, so only a seed given here reproduces them. extra_keys of a
block are None, or a tuple of: ("lora", name, path) when a LoRA adapter is used,
then ("cache_salt", salt) on the first block only. Multimodal and prompt-embeds
keys are not reproduced. KV events carry the low 64 bits of the big-endian
integer of each hash by default (`as_event_int`).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
from collections.abc import Callable, Sequence
from typing import Any

import xxhash

from kvstore.errors import BadRequestError

ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
DEFAULT_SEED = "vllm-none-hash"
_PICKLE_PROTOCOL = 5  # pickle.HIGHEST_PROTOCOL on the Pythons vLLM supports


def _cbor(obj: Any) -> bytes:
    """Canonical CBOR (RFC 8949 core deterministic) of ints, bytes, str, tuples/lists, None."""
    if obj is None:
        return b"\xf6"
    if isinstance(obj, bool):
        return b"\xf5" if obj else b"\xf4"
    if isinstance(obj, int):
        return _head(0, obj) if obj >= 0 else _head(1, -1 - obj)
    if isinstance(obj, bytes | bytearray | memoryview):
        data = bytes(obj)
        return _head(2, len(data)) + data
    if isinstance(obj, str):
        data = obj.encode()
        return _head(3, len(data)) + data
    if isinstance(obj, tuple | list):
        return _head(4, len(obj)) + b"".join(_cbor(x) for x in obj)
    raise BadRequestError(f"cannot CBOR-encode {type(obj).__name__}")


def _head(major: int, n: int) -> bytes:
    if n >= 1 << 64:
        raise BadRequestError("CBOR integer too large")
    m = major << 5
    if n < 24:
        return bytes([m | n])
    for extra, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
        if n < 1 << (8 * struct.calcsize(fmt)):
            return bytes([m | extra]) + struct.pack(fmt, n)
    raise AssertionError("unreachable")


def hash_fn(algorithm: str) -> Callable[[Any], bytes]:
    """vLLM's hash function of that name (`--prefix-caching-hash-algo`)."""
    serialize: Callable[[Any], bytes]
    if algorithm not in ALGORITHMS:
        raise BadRequestError(f"unknown vLLM hash algorithm {algorithm!r}; one of {ALGORITHMS}")
    if algorithm.endswith("_cbor"):
        serialize = _cbor
    else:

        def serialize(obj: Any) -> bytes:
            return pickle.dumps(obj, protocol=_PICKLE_PROTOCOL)

    if algorithm.startswith("sha256"):
        return lambda obj: hashlib.sha256(serialize(obj)).digest()
    return lambda obj: xxhash.xxh3_128_digest(serialize(obj))


def none_hash(algorithm: str = "sha256", seed: str | None = None) -> bytes:
    """NONE_HASH, the parent of every first block. `seed` defaults to $PYTHONHASHSEED,
    then (SHA-256 variants only) to vLLM's fixed "vllm-none-hash"."""
    seed = seed if seed is not None else os.environ.get("PYTHONHASHSEED")
    if seed is None:
        if algorithm.startswith("xxhash"):
            raise BadRequestError(
                "vLLM's xxhash NONE_HASH seed is random per process: give the engines' "
                "PYTHONHASHSEED as seed"
            )
        seed = DEFAULT_SEED
    return hash_fn(algorithm)(seed)


def extra_keys(
    block_index: int, lora: tuple[str, str] | None = None, cache_salt: str | None = None
) -> tuple[Any, ...] | None:
    """The extra keys vLLM mixes into block `block_index`'s hash (None when none)."""
    keys: list[tuple[Any, ...]] = []
    if lora is not None:
        keys.append(("lora", lora[0], lora[1]))
    if cache_salt and block_index == 0:
        keys.append(("cache_salt", cache_salt))
    return tuple(keys) if keys else None


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    algorithm: str = "sha256",
    *,
    seed: str | None = None,
    lora: tuple[str, str] | None = None,
    cache_salt: str | None = None,
) -> list[bytes]:
    """vLLM's hashes of the full blocks of `token_ids` (a partial last block has none)."""
    if not isinstance(block_size, int) or block_size <= 0:
        raise BadRequestError(f"block_size must be a positive int, got {block_size!r}")
    tokens = [int(t) for t in token_ids]
    if any(t < 0 for t in tokens):
        raise BadRequestError("token ids must be >= 0")
    fn = hash_fn(algorithm)
    parent = none_hash(algorithm, seed)
    out: list[bytes] = []
    for i in range(len(tokens) // block_size):
        block = tuple(tokens[i * block_size : (i + 1) * block_size])
        parent = fn((parent, block, extra_keys(i, lora, cache_salt)))
        out.append(parent)
    return out


def as_event_int(block_hash: bytes) -> int:
    """The integer vLLM publishes in KV events for a hash (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1,
    its default): the low 64 bits of the big-endian integer."""
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)
