"""The write path: PutStart -> one-sided WRITE of every replica -> PutEnd, or, for
puts that fit this client's extent lease, WRITE -> CommitExtent (kvstore.client.extents).

One PutStart, one transfer batch, one PutEnd (and one PutRevoke for the keys whose
writes failed) per call, whatever the number of keys. A key is visible only after
PutEnd, so a writer that dies mid-put leaves nothing visible; the master reclaims
its space after `put_timeout_s`. Writes still in flight after the wait (a hung
peer) are not revoked either: their space must not be reused before they land,
so the master's timeout reclaims it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import xxhash

from kvstore.client.context import OpContext, moved, resolve
from kvstore.client.datapath import BatchResult, Transfer
from kvstore.client.extents import eligible, eligible_one
from kvstore.client.steps import Io, Op, Rpc
from kvstore.edge import from_pb_location
from kvstore.errors import KVStoreError, NotFoundError, TransferError
from kvstore.rpc_errors import error_for
from kvstore.transfer.base import SegmentDescriptor, TransferOp
from kvstore.types import Location, Tier
from kvstore.v1 import master_pb2

checksum_of = xxhash.xxh3_64_intdigest
ALIGN_SLACK = 256  # per object an extent is asked for: its start is aligned


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
            item.tier = int(opts.tier)  # type: ignore[assignment]  # proto enum: an int
        items.append(item)
    return master_pb2.PutStartRequest(client_id=ctx.config.id, client_node=ctx.node_id, items=items)


def _writer_lease_ask(ctx: OpContext) -> int:
    """Milliseconds of writer lease a commit asks for (kvstore.master.writerleases): a
    get of the keys then reads them from where they were written with no lookup. Only
    where cached reads are checked (the cache is off without checksums)."""
    return int(ctx.config.location_cache_ttl_s * 1000) if ctx.locations.capacity else 0


def put_op(
    ctx: OpContext, keys: Sequence[str], views: Sequence[memoryview], opts: PutOptions
) -> Op[list[KVStoreError | None]]:
    """Write `views[i]` under wire key `keys[i]`; a result per key (None = committed).
    Inside this client's extent when the batch qualifies (one round trip), else (and for
    what failed there) by PutStart / PutEnd."""
    replicas = opts.replicas or ctx.config.replicas
    if ctx.locations.capacity:  # a key put again must not be read from where it was
        ctx.locations.drop(keys)
    if not eligible(ctx.extents, views, replicas, opts.tier, opts.pin_ttl_s):
        return (yield from _started_put_op(ctx, keys, views, opts))
    results: list[KVStoreError | None] = [None] * len(keys)
    group = ctx.config.wire_key(opts.group) if opts.group else ""
    todo = yield from extent_put_op(ctx, keys, views, group, results)
    if todo:
        rest = yield from _started_put_op(
            ctx, [keys[i] for i in todo], [views[i] for i in todo], opts
        )
        for i, res in zip(todo, rest, strict=True):
            results[i] = res
    return results


def put_one_op(
    ctx: OpContext, key: str, view: memoryview, opts: PutOptions
) -> Op[KVStoreError | None]:
    """`put_op` of one key (wire key `key`): its result. A single put that fits the
    extent and lands in memory this process maps is written and committed here with no
    per-key lists, dataclasses or nested generators (the common `put` / `put_from`);
    anything else takes the same general steps as `put_op`."""
    size = view.nbytes
    holder = ctx.extents
    if ctx.locations.capacity:  # a key put again must not be read from where it was
        ctx.locations.drop((key,))
    if not eligible_one(holder, size, opts.replicas or ctx.config.replicas, opts.tier,
                        opts.pin_ttl_s):  # fmt: skip
        return (yield from _started_put_op(ctx, [key], [view], opts))[0]
    group = ctx.config.wire_key(opts.group) if opts.group else ""
    taken = holder.take_one(size)
    if taken is None:  # a grant first (or a fallback): the general path
        results: list[KVStoreError | None] = [None]
        if (yield from extent_put_op(ctx, [key], [view], group, results)):
            return (yield from _started_put_op(ctx, [key], [view], opts))[0]
        return results[0]
    extent_id, loc, ask = taken
    try:
        result = yield from _write_one_in_extent(ctx, key, view, group, extent_id, loc, ask)
    except BaseException:
        holder.abandon(extent_id)  # its write's fate is unknown: never release it
        holder.done(extent_id, ask)
        raise
    if holder.done(extent_id, ask):  # replaced meanwhile, and this was its last put
        yield from _release(ctx, extent_id)
    if result is _RETRY:
        return (yield from _started_put_op(ctx, [key], [view], opts))[0]
    return result


_RETRY = TransferError("put again through PutStart")  # a sentinel, never raised or returned


def _write_one_in_extent(
    ctx: OpContext, key: str, view: memoryview, group: str, extent_id: int, loc: Location,
    ask: int,
) -> Op[KVStoreError | None]:  # fmt: skip
    """`_write_in_extent` of one key at `loc`: its result, or `_RETRY` (PutStart)."""
    size = view.nbytes
    desc = ctx.directory.descriptor(loc)
    mem = ctx.data.mapped(desc, loc.capability) if desc is not None else None
    if mem is None or loc.offset + size > mem.nbytes or size > MAPPED_WRITE_MAX:
        results: list[KVStoreError | None] = [None]
        retry = yield from _write_in_extent(
            ctx, [key], [view], group, results, extent_id, [loc], ask
        )
        return _RETRY if retry else results[0]
    mem[loc.offset : loc.offset + size] = view
    checksum = checksum_of(view) if ctx.config.checksums else 0
    request = _commit_request(ctx, extent_id, ask, size + ALIGN_SLACK)
    request.items.add(key=key, offset=loc.offset, size=size, group=group, checksum=checksum)
    reply = yield from _commit(ctx, request, ask)
    if reply is None:  # the lease ended on the master: nothing was committed
        ctx.extents.fallbacks += 1
        return _RETRY
    lease_s = reply.read_lease_ms / 1000
    (status,) = reply.results
    err = error_for(status.code, status.message) if status.code else None
    if lease_s > 0:
        ctx.writer_leased = True
        if err is None:  # held for a margin short of the lease (locations)
            if loc.capability:
                loc = replace(loc, capability=b"")
            ctx.locations.put(key, size, checksum, (loc,), lease_s)
    return err


def _started_put_op(
    ctx: OpContext, keys: Sequence[str], views: Sequence[memoryview], opts: PutOptions,
    retry: bool = True,
) -> Op[list[KVStoreError | None]]:  # fmt: skip
    """PutStart, WRITE every replica, PutEnd; a result per key. Keys whose WRITE could
    not reach their node are revoked, the node reported (the master fences it), and put
    once more (`retry`): placed elsewhere now."""
    results: list[KVStoreError | None] = [None] * len(keys)
    unreachable: set[str] = set()  # nodes a WRITE of this call failed on
    sums: dict[int, int] = {}  # checksums, computed while the WRITEs are in flight
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
        settled = yield from _write(ctx, started, views, results, unreachable, sums)
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
        request = master_pb2.PutEndRequest(client_id=ctx.config.id, keys=[keys[i] for i in ok],
                                           read_lease_ms=_writer_lease_ask(ctx))  # fmt: skip
        if ctx.config.checksums:  # readers verify it; SSD replicas are indexed with it
            request.checksums.extend([sums.get(i) or checksum_of(views[i]) for i in ok])
        end = yield Rpc("PutEnd", request)
        lease_s = end.read_lease_ms / 1000
        ctx.writer_leased |= lease_s > 0
        if end.promote_after:  # for the SSD locations cached below
            ctx.locations.promote_after = end.promote_after
        for j, (i, status) in enumerate(zip(ok, end.results, strict=True)):
            results[i] = err = error_for(status.code, status.message)
            if err is None and lease_s > 0:
                locs = [replace(loc, capability=b"") for loc in started[i]]
                sums_i = request.checksums[j]
                # SSD replicas too: the writer's reads of them are reported with its
                # next lookup and count towards promotion (under this writer lease)
                ctx.locations.put(
                    keys[i], views[i].nbytes, sums_i, locs, lease_s, ssd=True, read=False
                )
    written = set(ok)
    failed = [keys[i] for i in started if i not in written]
    if failed and settled:
        yield from _revoke(ctx, failed)
    again = [i for i in started if isinstance(results[i], TransferError)]
    # only nodes that still failed (not those that moved and took the retry)
    unreachable &= {loc.node_id for i in again for loc in started[i]}
    if retry and settled and again and unreachable:
        suspects = [loc for i in again for loc in started[i] if loc.node_id in unreachable]
        yield from _report_unreachable(ctx, (yield from _unmoved(ctx, suspects)))
        sub = yield from _started_put_op(
            ctx, [keys[i] for i in again], [views[i] for i in again], opts, retry=False
        )
        for i, res in zip(again, sub, strict=True):
            results[i] = res
    return results


def _unmoved(ctx: OpContext, locs: Sequence[Location]) -> Op[set[str]]:
    """The nodes of `locs` whose segment, after one directory refresh, is still there on
    the same endpoint: a failed transfer to one of them means the node is unreachable
    (not restarted elsewhere, not gone)."""
    before = [ctx.directory.descriptor(loc) for loc in locs]
    after = yield from resolve(ctx, locs, refresh=True)
    return {
        loc.node_id
        for loc, old, new in zip(locs, before, after, strict=True)
        if new is not None and new == old
    }


def _report_unreachable(ctx: OpContext, nodes: set[str]) -> Op[None]:
    """Tell the master which nodes' data plane failed us (best effort)."""
    if not nodes:
        return
    request = master_pb2.ReportUnreachableRequest(client_id=ctx.config.id, node_ids=sorted(nodes))
    try:
        yield Rpc("ReportUnreachable", request)
    except KVStoreError:
        return


def _write(
    ctx: OpContext,
    started: dict[int, list[Location]],
    views: Sequence[memoryview],
    results: list[KVStoreError | None],
    unreachable: set[str] | None = None,
    sums: dict[int, int] | None = None,
) -> Op[bool]:
    """WRITE every replica of every started key as one batch; False if not all settled.
    The nodes of failed WRITEs go into `unreachable`; with `sums` (and checksums on),
    each key's checksum is computed there while the engines move its bytes."""
    flat = [(i, loc) for i, locs in started.items() for loc in locs]
    descs = yield from resolve(ctx, [loc for _, loc in flat])
    transfers, owners, locs_of = [], [], []
    for (i, loc), desc in zip(flat, descs, strict=True):
        if desc is None:
            results[i] = results[i] or TransferError(
                f"segment {loc.segment!r} of node {loc.node_id!r} is not in the pool"
            )
            continue
        transfers.append(Transfer(desc, loc.offset, views[i], loc.capability))
        owners.append(i)
        locs_of.append(loc)

    def checksums() -> None:  # views are only read meanwhile, by the engines and by this
        if sums is not None and ctx.config.checksums:
            for i in dict.fromkeys(owners):
                if i not in sums:
                    sums[i] = checksum_of(views[i])

    batch: BatchResult = yield Io(lambda: ctx.data.run(TransferOp.WRITE, transfers, checksums))
    for (i, loc), err in zip(zip(owners, locs_of, strict=True), batch.errors, strict=True):
        if err is not None and results[i] is None:
            results[i] = err if isinstance(err, KVStoreError) else TransferError(str(err))
        if err is not None and unreachable is not None and isinstance(results[i], TransferError):
            unreachable.add(loc.node_id)
    return batch.settled


def extent_put_op(
    ctx: OpContext, keys: Sequence[str], views: Sequence[memoryview], group: str,
    results: list[KVStoreError | None],
) -> Op[list[int]]:  # fmt: skip
    """Put every key into this client's extent (kvstore.client.extents); the indices
    left for PutStart."""
    holder = ctx.extents
    sizes = [v.nbytes for v in views]
    taken = holder.take(sizes)
    if taken is None:
        release = holder.begin_grant()
        if release is None:  # another thread is getting the next extent: PutStart
            holder.fallbacks += len(keys)
            return list(range(len(keys)))
        try:
            yield from _grant(ctx, sum(sizes) + len(sizes) * ALIGN_SLACK, release)
        except KVStoreError:
            holder.end_grant()
            holder.fallbacks += len(keys)
            return list(range(len(keys)))
        except BaseException:  # cancelled: the next put may grant again
            holder.end_grant()
            raise
        taken = holder.take(sizes)
        if taken is None:
            holder.fallbacks += len(keys)
            return list(range(len(keys)))
    extent_id, locs, ask = taken
    try:
        retry = yield from _write_in_extent(ctx, keys, views, group, results, extent_id, locs, ask)
    except BaseException:
        holder.abandon(extent_id)  # its writes' fate is unknown: never release it
        holder.done(extent_id, ask)
        raise
    if holder.done(extent_id, ask):  # replaced meanwhile, and this was its last put
        yield from _release(ctx, extent_id)
    return retry


MAPPED_WRITE_MAX = 4 << 20  # a bigger batch goes to the engine (its copies release the GIL)


def _write_mapped(
    ctx: OpContext, descs: Sequence[SegmentDescriptor], locs: Sequence[Location],
    views: Sequence[memoryview],
) -> BatchResult | None:  # fmt: skip
    """Write a small batch straight into segment memory this process maps (a same-host
    node's DRAM segment, or its own): one memcpy per object on the caller's thread, no
    engine request, no completion to wait for (~40 us less per 64 KiB put here). None
    when some target is not mapped (or the batch is big): use the engine."""
    if sum(v.nbytes for v in views) > MAPPED_WRITE_MAX:
        return None
    mems = []
    for d, loc in zip(descs, locs, strict=True):
        mem = ctx.data.mapped(d, loc.capability)
        if mem is None or loc.offset + loc.length > mem.nbytes:
            return None
        mems.append(mem)
    for mem, loc, view in zip(mems, locs, views, strict=True):
        mem[loc.offset : loc.offset + view.nbytes] = view
    return BatchResult([None] * len(views), True)


def _write_in_extent(
    ctx: OpContext, keys: Sequence[str], views: Sequence[memoryview], group: str,
    results: list[KVStoreError | None], extent_id: int, locs: list[Location], ask: int,
) -> Op[list[int]]:  # fmt: skip
    """Write and commit the keys at `locs` of extent `extent_id` (the commit asking for
    the next extent when `ask`; an ask no commit carries ends with the caller's
    `ExtentHolder.done`); the indices left."""
    holder = ctx.extents
    sizes = [v.nbytes for v in views]
    descs = yield from resolve(ctx, locs)
    if any(d is None for d in descs):
        holder.abandon(extent_id)
        holder.fallbacks += len(keys)
        return list(range(len(keys)))
    batch = _write_mapped(ctx, descs, locs, views)  # type: ignore[arg-type]
    if batch is None:
        transfers = [
            Transfer(d, loc.offset, v, loc.capability)  # type: ignore[arg-type]
            for d, loc, v in zip(descs, locs, views, strict=True)
        ]
        batch = yield Io(lambda: ctx.data.run(TransferOp.WRITE, transfers))
    if not batch.settled or any(batch.errors):
        holder.abandon(extent_id)  # a write may still land: let the lease run out
    if any(isinstance(e, TransferError | OSError) for e in batch.errors):
        # reported unless it moved or its segment went: the PutStart below goes elsewhere
        yield from _report_unreachable(ctx, (yield from _unmoved(ctx, locs[:1])))
    ok = [i for i, err in enumerate(batch.errors) if err is None]
    retry = [i for i, err in enumerate(batch.errors) if err is not None]
    if not ok:
        holder.fallbacks += len(retry)
        return retry
    items = [
        master_pb2.CommitItem(
            key=keys[i],
            offset=locs[i].offset,
            size=sizes[i],
            group=group,
            checksum=checksum_of(views[i]) if ctx.config.checksums else 0,
        )
        for i in ok
    ]
    request = _commit_request(ctx, extent_id, ask, sum(sizes) + len(sizes) * ALIGN_SLACK)
    request.items.extend(items)
    reply = yield from _commit(ctx, request, ask)
    if reply is None:  # the lease ended on the master: nothing was committed
        holder.fallbacks += len(keys)
        return sorted(ok + retry)
    lease_s = reply.read_lease_ms / 1000
    ctx.writer_leased |= lease_s > 0
    for i, item, status in zip(ok, items, reply.results, strict=True):
        results[i] = err = error_for(status.code, status.message)
        if err is None and lease_s > 0:  # held for a margin short of the lease (locations)
            loc = locs[i] if not locs[i].capability else replace(locs[i], capability=b"")
            ctx.locations.put(keys[i], sizes[i], item.checksum, (loc,), lease_s)
    holder.fallbacks += len(retry)
    return retry


def _commit_request(
    ctx: OpContext, extent_id: int, ask: int, need: int
) -> master_pb2.CommitExtentRequest:
    """A CommitExtent of extent `extent_id`, its items still to add; it releases the
    extents this client left idle, and when `ask`, asks for the next extent sized as
    the next put's `_grant` would (at least `need` bytes: this put's, with its
    alignment slack). The master grants it only in the segment of `extent_id`
    (MasterState.grant_extent `after`): where the next data goes otherwise stays the
    choice of the grant a put asks for itself."""
    holder = ctx.extents
    request = master_pb2.CommitExtentRequest(
        client_id=ctx.config.id, extent_id=extent_id, read_lease_ms=_writer_lease_ask(ctx),
        release_extents=holder.take_released(),
    )  # fmt: skip
    if ask:
        request.next_size = max(holder.extent_bytes, need)
        request.next_min_size = need
        request.client_node = ctx.node_id
    return request


def _commit(
    ctx: OpContext, request: master_pb2.CommitExtentRequest, ask: int
) -> Op[master_pb2.CommitExtentResponse | None]:
    """Send a CommitExtent; its reply (the lease renewed, a next extent installed), or
    None when the lease had ended on the master (nothing was committed)."""
    holder = ctx.extents
    sent = time.monotonic()
    reply = None
    try:
        reply = yield Rpc("CommitExtent", request)
    except NotFoundError:
        holder.abandon(request.extent_id)
        return None
    finally:
        if ask:  # on any end: the next commit may ask again
            holder.answered(ask, reply, sent)
    holder.renewed(request.extent_id, reply.ttl_ms, sent, reply.capability)
    return reply


def _grant(ctx: OpContext, need: int, release: int) -> Op[None]:
    """A new extent of at least `need` bytes, releasing extent `release` (0 = none)."""
    holder = ctx.extents
    request = master_pb2.GrantExtentRequest(
        client_id=ctx.config.id, client_node=ctx.node_id, size=max(holder.extent_bytes, need),
        min_size=need, release_extent=release,
    )  # fmt: skip
    sent = time.monotonic()
    reply = yield Rpc("GrantExtent", request)
    holder.install(reply, sent)


def _release(
    ctx: OpContext, extent_id: int, closing: bool = False, others: Sequence[int] = ()
) -> Op[None]:
    """Give extent `extent_id` back, and `others` (best effort: their leases end
    anyway); `closing`: end this client's writer leases too (extent_id 0: only that)."""
    request = master_pb2.CommitExtentRequest(client_id=ctx.config.id, extent_id=extent_id,
                                             release=bool(extent_id),
                                             end_writer_leases=closing,
                                             release_extents=others)  # fmt: skip
    try:
        yield Rpc("CommitExtent", request)
    except KVStoreError:
        return


def release_op(ctx: OpContext) -> Op[None]:
    """At close: give the current extent back and end the writer leases this client
    was granted (its cache goes with it; until they ended, another client's remove of
    what it put would be refused). Best effort: both end on their own anyway."""
    ids = ctx.extents.detach()
    if ids or ctx.writer_leased:
        yield from _release(ctx, ids[0] if ids else 0, ctx.writer_leased, ids[1:])


def end_writer_leases_op(ctx: OpContext) -> Op[None]:
    """End the writer leases this client holds (kvstore.master.writerleases), and drop
    what its location cache learnt from them (the whole cache: it cannot tell which
    entries came from a commit), so another client may remove its objects at once."""
    if not ctx.writer_leased:
        return
    ctx.locations.clear()
    yield from _release(ctx, 0, closing=True)
    ctx.writer_leased = False


def _revoke(ctx: OpContext, keys: list[str]) -> Op[None]:
    """Best-effort PutRevoke (the master's put timeout reclaims what this misses)."""
    try:
        yield Rpc("PutRevoke", master_pb2.PutRevokeRequest(client_id=ctx.config.id, keys=keys))
    except KVStoreError:
        return
