"""Every public client method as one operation (a generator of steps), shared by the
sync `Client` and the async `AsyncClient`, which only differ in how they run steps.

Single-key methods raise the key's error; batched ones return a result per key.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvstore.buffers import byte_view
from kvstore.client.buffers import new_bytes
from kvstore.client.context import OpContext, call
from kvstore.client.reads import lookup_op, read_cached_now, read_op
from kvstore.client.steps import Op
from kvstore.client.writes import PutOptions, put_one_op, put_op
from kvstore.errors import (
    BadRequestError,
    KVStoreError,
    NotFoundError,
    NotReadyError,
    TooLargeError,
)
from kvstore.rpc_errors import error_for
from kvstore.types import Tier, check_key
from kvstore.v1 import master_pb2

_ABSENT = (NotFoundError, NotReadyError)  # "not there now": None / False, never raised in batches


@dataclass(frozen=True, slots=True)
class PrefixMatchResult:
    """Leading keys present in the pool, and per (node, tier), longest first."""

    pool_length: int
    matches: tuple[tuple[str, Tier, int], ...]  # (node_id, tier, length)


def _raise(err: KVStoreError | None) -> None:
    if err is not None:
        raise err


def _check_len(a: Sequence[Any], b: Sequence[Any], what: str) -> None:
    if len(a) != len(b):
        raise BadRequestError(f"{len(a)} keys but {len(b)} {what}")


class ClientOps:
    """Builds operations for one client context."""

    def __init__(self, ctx: OpContext) -> None:
        self.ctx = ctx

    def _keys(self, keys: Sequence[str]) -> list[str]:
        if isinstance(keys, str):
            raise BadRequestError("keys must be a sequence of str, not one str")
        return [self.ctx.config.wire_key(check_key(k)) for k in keys]

    # -- writes ---------------------------------------------------------------

    def batch_put_views(
        self, keys: Sequence[str], views: Sequence[memoryview], opts: PutOptions
    ) -> Op[list[KVStoreError | None]]:
        _check_len(keys, views, "values")
        wire = self._keys(keys)
        if len(wire) == 1:  # one key (the Mooncake facade's put_from): the one-key path
            return [(yield from put_one_op(self.ctx, wire[0], views[0], opts))]
        return (yield from put_op(self.ctx, wire, views, opts))

    def put(self, key: str, value: object, opts: PutOptions) -> Op[None]:
        view = byte_view(value)
        wire = self.ctx.config.wire_key(check_key(key))
        _raise((yield from put_one_op(self.ctx, wire, view, opts)))

    def put_from(
        self, key: str, buffer: object, offset: int, length: int | None, opts: PutOptions
    ) -> Op[None]:
        view = byte_view(buffer)
        end = view.nbytes if length is None else offset + length
        if not 0 <= offset <= end <= view.nbytes:
            raise BadRequestError(f"range [{offset}, {end}) outside buffer of {view.nbytes}")
        wire = self.ctx.config.wire_key(check_key(key))
        _raise((yield from put_one_op(self.ctx, wire, view[offset:end], opts)))

    def batch_put(
        self, items: Sequence[tuple[str, object]], opts: PutOptions
    ) -> Op[list[KVStoreError | None]]:
        keys = [k for k, _ in items]
        views = [byte_view(v) for _, v in items]
        return (yield from self.batch_put_views(keys, views, opts))

    def batch_put_from(
        self, keys: Sequence[str], buffers: Sequence[object], opts: PutOptions
    ) -> Op[list[KVStoreError | None]]:
        _check_len(keys, buffers, "buffers")
        return (yield from self.batch_put_views(keys, [byte_view(b) for b in buffers], opts))

    # -- reads ----------------------------------------------------------------

    def batch_get_into(
        self, keys: Sequence[str], outs: Sequence[object]
    ) -> Op[list[int | KVStoreError]]:
        _check_len(keys, outs, "buffers")
        views = [byte_view(o, writable=True) for o in outs]

        def target(i: int, size: int) -> memoryview | KVStoreError:
            if size > views[i].nbytes:
                return TooLargeError(f"{keys[i]!r} has {size} bytes, buffer {views[i].nbytes}")
            return views[i][:size]

        return (yield from read_op(self.ctx, self._keys(keys), target))

    def get_into_now(self, key: str, out: object) -> int | None:
        """`get_into` when it needs no step (reads.read_cached_now); else None."""
        if not self.ctx.locations.capacity:
            return None
        view = byte_view(out, writable=True)
        return read_cached_now(self.ctx, self.ctx.config.wire_key(check_key(key)), view)

    def get_into(self, key: str, out: object) -> Op[int]:
        res = (yield from self.batch_get_into([key], [out]))[0]
        if isinstance(res, KVStoreError):
            raise res
        return res

    def _read_new(self, keys: Sequence[str]) -> Op[list[bytes | KVStoreError]]:
        values: list[Any] = [None] * len(keys)

        def target(i: int, size: int) -> memoryview:
            values[i], view = new_bytes(size)
            return view

        results = yield from read_op(self.ctx, self._keys(keys), target)
        return [r if isinstance(r, KVStoreError) else values[i] for i, r in enumerate(results)]

    def get(self, key: str) -> Op[bytes]:
        res = (yield from self._read_new([key]))[0]
        if isinstance(res, KVStoreError):
            raise res
        return res

    def batch_get(self, keys: Sequence[str]) -> Op[list[bytes | None]]:
        """None for absent keys; a fault (no replica readable) raises after the batch."""
        results = yield from self._read_new(keys)
        for r in results:
            if isinstance(r, KVStoreError) and not isinstance(r, _ABSENT):
                raise r
        return [None if isinstance(r, KVStoreError) else r for r in results]

    # -- queries and admin ----------------------------------------------------

    def batch_size_of(self, keys: Sequence[str]) -> Op[list[int | None]]:
        """Sizes of committed keys (None when absent); a pure query (no lease, no LRU touch)."""
        found = yield from lookup_op(self.ctx, self._keys(keys), 0)
        out: list[int | None] = []
        for res in found:
            err = error_for(res.status.code, res.status.message)
            if err is not None and not isinstance(err, _ABSENT):
                raise err
            out.append(None if err is not None else res.size)
        return out

    def batch_exists(self, keys: Sequence[str]) -> Op[list[bool]]:
        return [s is not None for s in (yield from self.batch_size_of(keys))]

    def remove(self, key: str, force: bool, node_id: str = "") -> Op[bool]:
        """True when removed, False when absent; NotReadyError if leased/pinned/writing.
        `node_id`: only the replicas on that node (False when it holds none)."""
        keys = self._keys([key])  # our own read lease does not block our own remove
        self.ctx.locations.drop(keys)
        request = master_pb2.RemoveRequest(
            keys=keys, force=force, client_id=self.ctx.config.id, node_id=node_id
        )
        status = (yield from call("Remove", request)).results[0]
        err = error_for(status.code, status.message)
        if isinstance(err, NotFoundError):
            return False
        _raise(err)
        return True

    def match_prefix(self, keys: Sequence[str]) -> Op[PrefixMatchResult]:
        reply = yield from call("MatchPrefix", master_pb2.MatchPrefixRequest(keys=self._keys(keys)))
        matches = tuple((m.node_id, Tier(m.tier), m.length) for m in reply.matches)
        return PrefixMatchResult(reply.pool_length, matches)

    def stats(self) -> Op[dict[str, Any]]:
        return message_to_dict((yield from call("Stats", master_pb2.StatsRequest())))


def message_to_dict(msg: Any) -> dict[str, Any]:
    """A protobuf message as plain dicts/lists/ints/strs (64-bit ints stay ints; bytes
    become base64 strs, as in protobuf's JSON mapping: the dict stays JSON-ready)."""
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None:
            if field.is_repeated:
                out[field.name] = [message_to_dict(v) for v in value]
            else:
                out[field.name] = message_to_dict(value)
        elif field.type == field.TYPE_BYTES:
            b64 = [base64.b64encode(v).decode() for v in (value if field.is_repeated else [value])]
            out[field.name] = b64 if field.is_repeated else b64[0]
        else:
            out[field.name] = list(value) if field.is_repeated else value
    return out
