"""Hand-built protobuf encodings of the master's per-key replies (the hot path).

Building one upb message per key (a PutStartResult, a Location per replica, a
KeyStatus) costs microseconds of Python each; a batch of 1,000 keys spends most
of its time there. Here each reply is concatenated from cached byte strings (a
Location's node, tier and segment are the same for every replica of one segment)
plus varints, then parsed once, in C, into the reply message. The bytes are what
upb itself writes for the same message (tests compare both).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvstore.errors import KVStoreError
from kvstore.rpc_errors import code_for
from kvstore.types import Location
from kvstore.v1 import master_pb2

OK_STATUS = b"\x0a\x00"  # field 1 (status), an empty KeyStatus: code OK
_SMALL = [bytes([n]) for n in range(0x80)]


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte(s), the length, the payload."""
    return tag + varint(len(payload)) + payload


def _string_field(tag: bytes, text: str) -> bytes:
    return field(tag, text.encode()) if text else b""


class LocationEncoder:
    """Encodes Locations; the (node, tier, segment) prefix is cached per segment."""

    def __init__(self) -> None:
        self._prefixes: dict[tuple[str, int, str], bytes] = {}

    def _prefix(self, loc: Location) -> bytes:
        k = (loc.node_id, int(loc.tier), loc.segment)
        prefix = self._prefixes.get(k)
        if prefix is None:
            tier = b"\x10" + varint(k[1]) if k[1] else b""
            prefix = _string_field(b"\x0a", k[0]) + tier + _string_field(b"\x1a", k[2])
            if len(self._prefixes) > 4096:  # segments come and go: bound the cache
                self._prefixes.clear()
            self._prefixes[k] = prefix
        return prefix

    def encode(self, loc: Location) -> bytes:
        """The encoded common.Location message (zero fields omitted, as upb does)."""
        out = self._prefix(loc)
        if loc.offset:
            out += b"\x20" + varint(loc.offset)
        length = _LENGTHS.get(loc.length)
        if length is None:  # object sizes repeat: cache their encodings (bounded)
            length = b"\x28" + varint(loc.length)
            if len(_LENGTHS) < 1024:
                _LENGTHS[loc.length] = length
        return out + length


_LENGTHS: dict[int, bytes] = {}


def lookup_result(size: int, group: str, locations: Sequence[bytes]) -> bytes:
    """An encoded LookupResult of a hit: status OK, size, replicas (encoded), group."""
    reps = b"".join([field(b"\x1a", loc) for loc in locations])
    return OK_STATUS + b"\x10" + varint(size) + reps + _string_field(b"\x22", group)


def status_bytes(exc: KVStoreError | None) -> bytes:
    """An encoded KeyStatus message."""
    if exc is None:
        return b""
    return master_pb2.KeyStatus(code=code_for(exc), message=str(exc)).SerializeToString()


def put_start_response(
    results: Sequence[Sequence[Location] | KVStoreError],
    locations: LocationEncoder,
    placed: Callable[[int, list[bytes]], None] | None = None,
) -> master_pb2.PutStartResponse:
    """PutStartResponse: per key, status OK and its locations, or the key's error.
    `placed(i, encoded locations)` is called for each placed key (to reuse them)."""
    parts = []
    for i, r in enumerate(results):
        if isinstance(r, KVStoreError):
            body = field(b"\x0a", status_bytes(r))
        else:
            locs = [locations.encode(loc) for loc in r]
            body = OK_STATUS + b"".join([field(b"\x12", loc) for loc in locs])
            if placed is not None:
                placed(i, locs)
        parts.append(field(b"\x0a", body))
    return master_pb2.PutStartResponse.FromString(b"".join(parts))


def statuses_payload(results: Sequence[KVStoreError | None]) -> bytes:
    """`repeated KeyStatus results = 1` of PutEnd/PutRevoke/Remove replies."""
    if not any(results):
        return OK_STATUS * len(results)
    return b"".join(field(b"\x0a", status_bytes(r)) for r in results)
