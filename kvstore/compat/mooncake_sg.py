"""Scatter/gather puts and gets for the facade's multi-buffer forms: an object's bytes
move straight between the pool and the caller's buffers, one transfer per (buffer,
replica) in one batch, with no staging copy.

The client's own operations move one contiguous view per object; these two run on the
same machinery (its OpContext, master calls and data path) with several local views per
object at consecutive remote offsets. The checksum a put commits (and a get verifies)
is xxh3_64 of the concatenation, computed over the parts in order. A replica in memory
this process maps (its own lent segment, a same-host node's shared memory) is copied
in place, chunk by chunk, each chunk hashed right after it is copied (one pass over
the bytes instead of a copy and a hash); the others go as one transfer batch. They try one replica
and do not retry: a key whose transfer or checksum fails comes back as a TransferError
or CorruptError, and the facade puts or reads it once more through the client's own path
(staged, with its retries over replicas, node fencing and corruption reports).
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from kvstore.client.context import OpContext, resolve
from kvstore.client.datapath import BatchResult, Transfer
from kvstore.client.reads import COPY_CHUNK, copy_parts_hashed
from kvstore.client.steps import Io, Op, Rpc
from kvstore.client.writes import PutOptions
from kvstore.edge import from_pb_location
from kvstore.errors import CorruptError, KVStoreError, TooLargeError, TransferError
from kvstore.rpc_errors import error_for
from kvstore.transfer.base import TransferOp
from kvstore.transfer.shm import shm_reachable
from kvstore.types import Location, Tier
from kvstore.v1 import master_pb2

Parts = Sequence[memoryview]


def digest(parts: Parts) -> int:
    """xxh3_64 of the parts' concatenation (what a put of the joined bytes would commit)."""
    h = xxhash.xxh3_64()
    for p in parts:
        h.update(p)
    return h.intdigest()


def _as_error(err: Exception) -> KVStoreError:
    return err if isinstance(err, KVStoreError) else TransferError(str(err))


def put_parts_op(
    ctx: OpContext, keys: Sequence[str], parts: Sequence[Parts], opts: PutOptions
) -> Op[list[KVStoreError | None]]:
    """Put key i (a wire key) as the concatenation of `parts[i]`: PutStart, one WRITE
    batch of every part of every replica, PutEnd; a result per key (None = committed)."""
    replicas = opts.replicas or ctx.config.replicas
    group = ctx.config.wire_key(opts.group) if opts.group else ""
    items = []
    for key, ps in zip(keys, parts, strict=True):
        item = master_pb2.PutStartItem(
            key=key, size=sum(p.nbytes for p in ps), replicas=replicas, group=group,
            pin_ttl_ms=int(opts.pin_ttl_s * 1000),
        )  # fmt: skip
        if opts.tier is not None:
            item.tier = int(opts.tier)  # type: ignore[assignment]  # proto enum: an int
        items.append(item)
    request = master_pb2.PutStartRequest(client_id=ctx.config.id, client_node=ctx.node_id,
                                         items=items)  # fmt: skip
    reply = yield Rpc("PutStart", request)
    results: list[KVStoreError | None] = [None] * len(keys)
    started: dict[int, list[Location]] = {}
    for i, res in enumerate(reply.results):
        if res.status.code:
            results[i] = error_for(res.status.code, res.status.message)
        else:
            started[i] = [from_pb_location(loc) for loc in res.locations]
    if not started:
        return results
    try:
        flat = [(i, loc) for i, locs in started.items() for loc in locs]
        descs = yield from resolve(ctx, [loc for _, loc in flat])
        transfers, owners = [], []
        local: list[tuple[int, memoryview, int, bool]] = []  # key, segment, offset, hash it
        for (i, loc), desc in zip(flat, descs, strict=True):
            if desc is None:
                results[i] = results[i] or TransferError(f"segment {loc.segment!r} is gone")
                continue
            mem = ctx.data.mapped(desc, loc.capability)
            if mem is not None:  # this process maps it: copy in place, hashing as it goes
                first = ctx.config.checksums and all(j != i for j, *_ in local)
                local.append((i, mem, loc.offset, first))
                continue
            offset = loc.offset
            for part in parts[i]:
                transfers.append(Transfer(desc, offset, part, loc.capability))
                owners.append(i)
                offset += part.nbytes
        batch: BatchResult = yield Io(lambda: ctx.data.run(TransferOp.WRITE, transfers))
        for i, err in zip(owners, batch.errors, strict=True):
            if err is not None and results[i] is None:
                results[i] = _as_error(err)
        sums: dict[int, int] = {}
        if local:
            copied = yield Io(lambda: [_copy_in(parts[i], m, off, h) for i, m, off, h in local])
            for (i, _, _, hashed), res in zip(local, copied, strict=True):
                if isinstance(res, KVStoreError):
                    results[i] = results[i] or res
                elif hashed:
                    sums[i] = res
    except KVStoreError:
        yield from _revoke(ctx, [keys[i] for i in started])
        raise
    ok = [i for i in started if results[i] is None]
    if ok:
        end_req = master_pb2.PutEndRequest(client_id=ctx.config.id, keys=[keys[i] for i in ok])
        if ctx.config.checksums:
            end_req.checksums.extend([sums[i] if i in sums else digest(parts[i]) for i in ok])
        end = yield Rpc("PutEnd", end_req)
        for i, status in zip(ok, end.results, strict=True):
            results[i] = error_for(status.code, status.message)
    failed = [keys[i] for i in started if i not in set(ok)]
    if failed and batch.settled:  # writes still in flight: the master's timeout reclaims
        yield from _revoke(ctx, failed)
    return results


def get_parts_op(
    ctx: OpContext, keys: Sequence[str], parts: Sequence[Parts]
) -> Op[list[int | KVStoreError]]:
    """Read key i (a wire key) across `parts[i]` in order; bytes read or the key's error.
    Keys in the client's location cache are read with no master call and verified
    against their checksum (as the client's own cached reads); the rest, and cached
    reads that fail, go through one leased BatchLookup and one READ batch. An object
    larger than its parts together is TooLargeError; a failed READ or checksum is that
    key's TransferError / CorruptError."""
    results: list[int | KVStoreError] = [0] * len(keys)
    todo = list(range(len(keys)))
    cached: list[_Read] = []
    for i in todo if ctx.locations.capacity else ():
        entry = ctx.locations.get(keys[i])
        if entry is not None and entry.checksum and entry.size <= _room(parts[i]):
            cached.append((i, _first(ctx, list(entry.replicas)), entry.size, entry.checksum))
    if cached:
        yield from _read(ctx, cached, parts, results, force=True)
        stale = [i for i, *_ in cached if not isinstance(results[i], int)]
        ctx.locations.hits += len(cached) - len(stale)
        ctx.locations.stale += len(stale)
        ctx.locations.drop([keys[i] for i in stale])
        done = {i for i, *_ in cached} - set(stale)
        todo = [i for i in todo if i not in done]
    if not todo:
        return results
    lease_ms = max(1, int(ctx.config.lease_ttl_s * 1000))
    request = master_pb2.BatchLookupRequest(keys=[keys[i] for i in todo], lease_ttl_ms=lease_ms,
                                            client_id=ctx.config.id)  # fmt: skip
    reply = yield Rpc("BatchLookup", request)
    leased_s = reply.lease_ttl_ms / 1000  # the cache serves a key only inside its lease
    plan: list[_Read] = []
    for i, res in zip(todo, reply.results, strict=True):
        err = error_for(res.status.code, res.status.message)
        if err is None and res.size > _room(parts[i]):
            err = TooLargeError(f"object of {res.size} bytes, buffers of {_room(parts[i])}")
        if err is None and not res.replicas:
            err = TransferError("object has no readable replica")
        if err is not None:
            results[i] = err
            continue
        replicas = [from_pb_location(r) for r in res.replicas]
        plan.append((i, _first(ctx, replicas), res.size,
                     res.checksum if ctx.config.checksums else 0))  # fmt: skip
        ctx.locations.put(keys[i], res.size, res.checksum, replicas, leased_s)
    yield from _read(ctx, plan, parts, results, force=False)
    return results


_Read = tuple[int, Location, int, int]  # key index, replica, size, checksum (0 = none)


def _room(parts: Parts) -> int:
    return sum(p.nbytes for p in parts)


def _read(ctx: OpContext, plan: Sequence[_Read], parts: Sequence[Parts],
          results: list[int | KVStoreError], force: bool) -> Op[None]:  # fmt: skip
    """READ each planned key's replica across its parts; its result is the size, or the
    error. Verified when `force` (a cached location), on SSD, or by config. A replica in
    memory this process maps is copied out directly, hashed chunk by chunk as it is
    copied (one pass); the others are one READ batch."""
    descs = yield from resolve(ctx, [loc for _, loc, _, _ in plan])
    transfers, owners = [], []
    targets: dict[int, list[memoryview]] = {}
    local: list[tuple[int, Location, memoryview, bool]] = []
    for (i, loc, size, checksum), desc in zip(plan, descs, strict=True):
        if desc is None:
            results[i] = TransferError(f"segment {loc.segment!r} of {loc.node_id!r} is gone")
            continue
        targets[i] = _first_bytes(parts[i], size)
        results[i] = size
        verify = bool(checksum) and (force or loc.tier == Tier.SSD or ctx.config.verify_dram)
        mem = ctx.data.mapped(desc, loc.capability)
        if mem is not None:
            local.append((i, loc, mem, verify))
            continue
        offset = loc.offset
        for view in targets[i]:
            transfers.append(Transfer(desc, offset, view, loc.capability))
            owners.append(i)
            offset += view.nbytes
    if transfers:
        batch: BatchResult = yield Io(lambda: ctx.data.run(TransferOp.READ, transfers))
        for i, err in zip(owners, batch.errors, strict=True):
            if err is not None:
                results[i] = _as_error(err)
    checks = {i: checksum for i, _, _, checksum in plan}
    if local:
        lanes = ctx.config.copy_lanes
        copied = yield Io(lambda: [copy_parts_hashed(targets[i], m, loc.offset, v, lanes)
                                   for i, loc, m, v in local])  # fmt: skip
        for (i, loc, _, verify), res in zip(local, copied, strict=True):
            if isinstance(res, KVStoreError):
                results[i] = res
            elif verify and res != checks[i]:
                results[i] = CorruptError(f"the replica in {loc.segment!r} fails its checksum")
    mapped = {i for i, *_ in local}
    for i, loc, _, checksum in plan:
        if i in mapped or not isinstance(results[i], int):
            continue
        verify = bool(checksum) and (force or loc.tier == Tier.SSD or ctx.config.verify_dram)
        if verify and digest(targets[i]) != checksum:
            results[i] = CorruptError(f"the replica in {loc.segment!r} fails its checksum")
    served = [i for i, loc, _, _ in plan if loc.tier == Tier.SSD and isinstance(results[i], int)]
    ctx.ssd_reads += len(served)  # get_offload_rpc_read_count


def _copy_in(parts: Parts, mem: memoryview, offset: int, hash_it: bool) -> int | KVStoreError:
    """Copy `parts` in order to mem[offset:]; the xxh3_64 of the bytes when `hash_it`
    (each chunk hashed right after it is copied, while in cache), else 0."""
    n = sum(p.nbytes for p in parts)
    if offset < 0 or offset + n > mem.nbytes:
        return TransferError(f"range [{offset}, +{n}) is outside the mapped segment")
    h = xxhash.xxh3_64() if hash_it else None
    pos = offset
    for view in parts:
        for start in range(0, view.nbytes, COPY_CHUNK):
            chunk = view[start : start + COPY_CHUNK]
            mem[pos : pos + chunk.nbytes] = chunk
            pos += chunk.nbytes
            if h is not None:
                h.update(chunk)
    return h.intdigest() if h is not None else 0


def _first(ctx: OpContext, replicas: list[Location]) -> Location:
    """The replica to read: one this host maps first, then the fastest tier (as the
    client's own reads order them)."""

    def rank(loc: Location) -> tuple[bool, int]:
        desc = ctx.directory.descriptor(loc)
        local = desc is not None and ctx.data.transport != "tcp" and shm_reachable(desc)
        return (not local, int(loc.tier))

    return min(replicas, key=rank) if len(replicas) > 1 else replicas[0]


def _first_bytes(parts: Parts, n: int) -> list[memoryview]:
    """Views of the first `n` bytes across `parts`, in order."""
    out = []
    for p in parts:
        if n <= 0:
            break
        take = min(n, p.nbytes)
        out.append(p[:take])
        n -= take
    return out


def _revoke(ctx: OpContext, keys: list[str]) -> Op[None]:
    try:
        yield Rpc("PutRevoke", master_pb2.PutRevokeRequest(client_id=ctx.config.id, keys=keys))
    except KVStoreError:
        return
