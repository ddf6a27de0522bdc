"""The write path: PutStart -> one-sided WRITE of every replica -> PutEnd.

One PutStart, one transfer batch, one PutEnd (and one PutRevoke for the keys whose
writes failed) per call, whatever the number of keys. A key is visible only after
PutEnd, so a writer that dies mid-put leaves nothing visible; the master reclaims
its space after `put_timeout_s`. Writes still in flight after the wait (a hung
peer) are not revoked either: their space must not be reused before they land,
so the master's timeout reclaims it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from kvstore.client.context import OpContext, moved, resolve
from kvstore.client.datapath import BatchResult, Transfer
from kvstore.client.steps import Io, Op, Rpc
from kvstore.edge import from_pb_location
from kvstore.errors import KVStoreError, TransferError
from kvstore.rpc_errors import error_for
from kvstore.transfer.base import TransferOp
from kvstore.types import Location, Tier
from kvstore.v1 import master_pb2

checksum_of = xxhash.xxh3_64_intdigest


@dataclass(frozen=True, slots=True)
class PutOptions:
    """Per-call put options (`replicas` None = the client's default)."""

    group: str = ""
    replicas: int | None = None
    pin_ttl_s: float = 0.0
    tier: Tier | None = None


def _start_request(
    ctx: OpContext, keys: Sequence[str], views: Sequence[memoryview], opts: PutOptions
) -> master_pb2.PutStartRequest:
    group = ctx.config.wire_key(opts.group) if opts.group else ""
    replicas = opts.replicas or ctx.config.replicas
    items = []
    for key, view in zip(keys, views, strict=True):
        item = master_pb2.PutStartItem(
            key=key, size=view.nbytes, replicas=replicas, group=group,
            pin_ttl_ms=int(opts.pin_ttl_s * 1000),
        )  # fmt: skip
        if opts.tier is not None:
            item.tier = int(opts.tier)
        items.append(item)
    return master_pb2.PutStartRequest(client_id=ctx.config.id, client_node=ctx.node_id, items=items)


def put_op(
    ctx: OpContext, keys: Sequence[str], views: Sequence[memoryview], opts: PutOptions
) -> Op[list[KVStoreError | None]]:
    """Write `views[i]` under wire key `keys[i]`; a result per key (None = committed)."""
    results: list[KVStoreError | None] = [None] * len(keys)
    reply = yield Rpc("PutStart", _start_request(ctx, keys, views, opts))
    started: dict[int, list[Location]] = {}
    for i, res in enumerate(reply.results):
        if res.status.code:
            results[i] = error_for(res.status.code, res.status.message)
        else:
            started[i] = [from_pb_location(loc) for loc in res.locations]
    if not started:
        return results
    try:
        settled = yield from _write(ctx, started, views, results)
        stale = {i: started[i] for i in started if isinstance(results[i], TransferError)}
        if stale and settled:  # keep the keys all of whose replicas' nodes moved
            flat = [loc for locs in stale.values() for loc in locs]
            flags = iter((yield from moved(ctx, flat)))
            # a list, not a generator: every flag is consumed, so the iterator stays aligned
            stale = {i: locs for i, locs in stale.items() if all([next(flags) for _ in locs])}
        if stale:  # the node restarted on a new endpoint: once more, there
            for i in stale:
                results[i] = None
            settled = yield from _write(ctx, stale, views, results)
    except KVStoreError:
        yield from _revoke(ctx, [keys[i] for i in started])
        raise
    ok = [i for i in started if results[i] is None]
    if ok:
        request = master_pb2.PutEndRequest(client_id=ctx.config.id, keys=[keys[i] for i in ok])
        if ctx.config.checksums:  # readers verify it; SSD replicas are indexed with it
            request.checksums.extend([checksum_of(views[i]) for i in ok])
        end = yield Rpc("PutEnd", request)
        for i, status in zip(ok, end.results, strict=True):
            results[i] = error_for(status.code, status.message)
    written = set(ok)
    failed = [keys[i] for i in started if i not in written]
    if failed and settled:
        yield from _revoke(ctx, failed)
    return results


def _write(
    ctx: OpContext,
    started: dict[int, list[Location]],
    views: Sequence[memoryview],
    results: list[KVStoreError | None],
) -> Op[bool]:
    """WRITE every replica of every started key as one batch; False if not all settled."""
    flat = [(i, loc) for i, locs in started.items() for loc in locs]
    descs = yield from resolve(ctx, [loc for _, loc in flat])
    transfers, owners = [], []
    for (i, loc), desc in zip(flat, descs, strict=True):
        if desc is None:
            results[i] = results[i] or TransferError(
                f"segment {loc.segment!r} of node {loc.node_id!r} is not in the pool"
            )
            continue
        transfers.append(Transfer(desc, loc.offset, views[i]))
        owners.append(i)
    batch: BatchResult = yield Io(lambda: ctx.data.run(TransferOp.WRITE, transfers))
    for i, err in zip(owners, batch.errors, strict=True):
        if err is not None and results[i] is None:
            results[i] = err if isinstance(err, KVStoreError) else TransferError(str(err))
    return batch.settled


def _revoke(ctx: OpContext, keys: list[str]) -> Op[None]:
    """Best-effort PutRevoke (the master's put timeout reclaims what this misses)."""
    try:
        yield Rpc("PutRevoke", master_pb2.PutRevokeRequest(client_id=ctx.config.id, keys=keys))
    except KVStoreError:
        return
