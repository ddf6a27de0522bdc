"""Core types shared by every kvstore package.

A block is identified by its chained prefix hash (`BlockHash`); the store keys
objects by `ObjectKey` (a str, usually the hex of a block hash plus a suffix such
as the layer). Tiers are ordered: lower is faster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import NewType

from kvstore.errors import BadRequestError

BlockHash = NewType("BlockHash", bytes)
ObjectKey = NewType("ObjectKey", str)

MAX_KEY_BYTES = 1024


class Tier(IntEnum):
    """Storage tiers, fastest first. A tier is never a string."""

    HBM = 0
    DRAM = 1
    SSD = 2


@dataclass(frozen=True, slots=True)
class Location:
    """Where one replica of an object lives: node, tier, segment and byte range."""

    node_id: str
    tier: Tier
    segment: str
    offset: int
    length: int
    # Secured mode: the master's grant to READ or WRITE this range (kvstore.security.
    # capabilities); not part of the location's identity (equality, hash).
    capability: bytes = field(default=b"", compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length <= 0:
            raise BadRequestError(f"bad location range offset={self.offset} length={self.length}")


def check_key(key: object) -> ObjectKey:
    """Validate a key: a non-empty str of at most MAX_KEY_BYTES UTF-8 bytes."""
    if not isinstance(key, str):
        raise BadRequestError(f"key must be str, got {type(key).__name__}")
    if not key:
        raise BadRequestError("key must not be empty")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise BadRequestError(f"key longer than {MAX_KEY_BYTES} bytes")
    return ObjectKey(key)


def block_key(block_hash: bytes, suffix: str = "") -> ObjectKey:
    """The object key of one block (optionally one piece of it, e.g. a layer)."""
    return ObjectKey(block_hash.hex() + (f"/{suffix}" if suffix else ""))
