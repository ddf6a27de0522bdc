"""kvstore: a pooled, tiered KV-cache store for prefill/decode-disaggregated serving."""

from kvstore.errors import (
    BadRequestError,
    CorruptError,
    ExistsError,
    KVStoreError,
    NoSpaceError,
    NotFoundError,
    NotReadyError,
    TooLargeError,
    TransferError,
    UnavailableError,
)
from kvstore.hashing import block_hashes, longest_cached_prefix, make_namespace
from kvstore.types import BlockHash, Location, ObjectKey, Tier

__all__ = [
    "BadRequestError",
    "BlockHash",
    "CorruptError",
    "ExistsError",
    "KVStoreError",
    "Location",
    "NoSpaceError",
    "NotFoundError",
    "NotReadyError",
    "ObjectKey",
    "Tier",
    "TooLargeError",
    "TransferError",
    "UnavailableError",
    "block_hashes",
    "longest_cached_prefix",
    "make_namespace",
]
