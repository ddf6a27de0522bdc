"""A node's NIXL endpoint as one blob: agent metadata + each exposed segment's base.

A storage node serves all its DRAM segments from one NIXL agent. It publishes
`NodeEndpoint.nixl_metadata` = `pack_node_meta(agent_meta, {segment: base address})`
through the master; a client turns that blob into the per-segment `nixl_meta` a
SegmentDescriptor carries with `segment_meta`.

Layout (little endian): b"KVN1", u16 count, count x (u16 name length, name utf-8,
u64 base address), then the agent metadata (the rest).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from kvstore.errors import BadRequestError
from kvstore.transfer.nixl import NixlEngine, pack_meta, unpack_meta

MAGIC = b"KVN1"
_COUNT = struct.Struct("<H")
_ADDR = struct.Struct("<Q")


def pack_node_meta(agent_meta: bytes, bases: Mapping[str, int]) -> bytes:
    """One blob naming every exposed segment's base address and the agent metadata."""
    if not agent_meta:
        raise BadRequestError("NIXL agent metadata is empty")
    if len(bases) > 0xFFFF:
        raise BadRequestError(f"too many NIXL segments: {len(bases)}")
    parts = [MAGIC, _COUNT.pack(len(bases))]
    for name, address in bases.items():
        raw = name.encode()
        if len(raw) > 0xFFFF:
            raise BadRequestError("segment name too long for NIXL metadata")
        parts += [_COUNT.pack(len(raw)), raw, _ADDR.pack(address)]
    parts.append(agent_meta)
    return b"".join(parts)


def unpack_node_meta(blob: bytes) -> tuple[bytes, dict[str, int]]:
    """(agent metadata, {segment: base address}); BadRequestError when malformed."""
    if blob[: len(MAGIC)] != MAGIC:
        raise BadRequestError("not a kvstore NIXL node metadata blob")
    try:
        (count,) = _COUNT.unpack_from(blob, len(MAGIC))
        pos = len(MAGIC) + _COUNT.size
        bases: dict[str, int] = {}
        for _ in range(count):
            (size,) = _COUNT.unpack_from(blob, pos)
            name = blob[pos + _COUNT.size : pos + _COUNT.size + size].decode()
            pos += _COUNT.size + size
            (bases[name],) = _ADDR.unpack_from(blob, pos)
            pos += _ADDR.size
    except (struct.error, UnicodeDecodeError) as e:
        raise BadRequestError(f"truncated NIXL node metadata: {e}") from e
    if pos >= len(blob):
        raise BadRequestError("NIXL node metadata has no agent metadata")
    return blob[pos:], bases


def segment_meta(blob: bytes, segment: str) -> bytes:
    """The SegmentDescriptor `nixl_meta` of `segment`, or b"" when the node publishes
    none for it (no blob, a malformed one, or a segment it does not serve by NIXL)."""
    if not blob:
        return b""
    try:
        agent_meta, bases = unpack_node_meta(blob)
    except BadRequestError:
        return b""
    address = bases.get(segment)
    return b"" if address is None else pack_meta(address, agent_meta)


def expose_all(engine: NixlEngine, buffers: Sequence[tuple[str, object]]) -> bytes:
    """Register every (name, buffer) with `engine` and return the node blob.

    The agent metadata grows with each registration, so the blob carries the one
    taken after the last."""
    bases: dict[str, int] = {}
    agent_meta = b""
    for name, buffer in buffers:
        bases[name], agent_meta = unpack_meta(engine.expose(name, buffer).nixl_meta)
    return pack_node_meta(agent_meta, bases)
