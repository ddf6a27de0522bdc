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

# The pool client pulls in grpc: load it on first use, so `import kvstore.tiers`
# (and the grpc-free conductor and simulator) stay light.
_LAZY = {"Client", "AsyncClient", "ClientConfig", "PrefixMatchResult"}
_LAZY_CONDUCTOR = {"ConductorClient", "AsyncConductorClient"}


def __getattr__(name: str) -> object:
    if name in _LAZY_CONDUCTOR:
        from kvstore.client import conductor

        return getattr(conductor, name)
    if name in _LAZY:
        from kvstore import client

        return getattr(client, name)
    raise AttributeError(f"module 'kvstore' has no attribute {name!r}")


__all__ = [
    "AsyncClient",
    "AsyncConductorClient",
    "BadRequestError",
    "BlockHash",
    "Client",
    "ClientConfig",
    "ConductorClient",
    "CorruptError",
    "ExistsError",
    "KVStoreError",
    "Location",
    "NoSpaceError",
    "NotFoundError",
    "NotReadyError",
    "ObjectKey",
    "PrefixMatchResult",
    "Tier",
    "TooLargeError",
    "TransferError",
    "UnavailableError",
    "block_hashes",
    "longest_cached_prefix",
    "make_namespace",
]
