"""Who may call what on the master: one table, one rule per RPC (kvstore.security.guard
runs it after the limits, before the servicer).

    RPC                                     who may call it
    RegisterNode Heartbeat MountSegment     the node itself (node_id == its id; a client
      NodeTasks AnnounceObjects               lending a segment is the node of its id)
    UnmountSegment                          the node itself, or admin
    PutStart PutEnd PutRevoke               client_id == its id: the writer is the
      GrantExtent CommitExtent                credential, so only it commits or revokes
    BatchLookup MatchPrefix ListObjects     anyone; client_id, when given, is its id
      Inspect ReportCorrupt ReportUnreachable
    Remove                                  the object's writer, or admin; force: admin
    Evict Pin Unpin Cordon, and any RPC     admin
      this table does not name
    Stats                                   anyone authenticated

A client removes only objects it wrote itself (their writer is its id; an object the
master restored from its journal has no recorded writer, and then its tenant decides).
Tenant scope (a client credential): keys and groups it writes or removes must carry its
tenant's prefix (else PERMISSION_DENIED, whatever exists); a key of another tenant that
it reads, matches, lists, inspects or reports is answered exactly as a miss.

A rule raises PermissionDeniedError (PERMISSION_DENIED) and nothing runs, or returns a
`Post` that finishes the reply (the misses it answered itself). The insecure identity
passes every rule (development mode; the servers warn). Admins are not confined to a
tenant; nodes are not (a node holds every tenant's bytes) but act only as themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvstore.errors import BadRequestError, NotFoundError, PermissionDeniedError
from kvstore.security.identity import Identity
from kvstore.v1 import master_pb2

Post = Callable[[Any], Any]


class Answer(Exception):
    """Raised by a rule that answers without the servicer (e.g. an empty listing)."""

    def __init__(self, reply: Any) -> None:
        super().__init__("answered by the guard")
        self.reply = reply


@dataclass(slots=True)
class Call:
    """One call being authorized: who, what, against which master state."""

    ident: Identity
    method: str
    request: Any
    state: Any
    keys: list[str] | None = None  # request.keys as a list, when the guard made one
    items: Any = None  # PutStart / CommitExtent items as columns (limits.Items), likewise

    @property
    def free(self) -> bool:
        """Insecure mode: every rule passes."""
        return self.ident.source == "insecure"

    def deny(self, why: str) -> PermissionDeniedError:
        return PermissionDeniedError(f"{self.method}: {self.ident} may not {why}")

    def foreign(self, key: str) -> bool:
        """True when a scoped client names a key outside its tenant."""
        return self.ident.scoped and not key.startswith(self.ident.namespace)


def authorize(call: Call) -> Post | None:
    """Run the rule of `call.method` (admin only when none is listed)."""
    if call.free:
        return None
    rule = RULES.get(call.method, _admin)
    return rule(call)


# ---- rules ------------------------------------------------------------------------


def _admin(call: Call) -> None:
    if not call.ident.admin:
        raise call.deny("call an admin RPC")


def _node_self(call: Call) -> None:
    node_id = call.request.node_id
    if call.ident.role not in ("node", "client") or node_id != call.ident.id:
        raise call.deny(f"act as node {node_id!r}")


def _unmount(call: Call) -> None:
    if not call.ident.admin:
        _node_self(call)


def _writer(call: Call) -> None:
    if call.ident.role not in ("client", "admin"):
        raise call.deny("write objects")
    if call.request.client_id != call.ident.id:
        raise call.deny(f"write as client {call.request.client_id!r}")


def _reader(call: Call) -> None:
    reader = getattr(call.request, "client_id", "")
    if reader and reader != call.ident.id:
        raise call.deny(f"read as client {reader!r}")


def _own_keys(call: Call, keys: Any) -> None:
    if call.ident.scoped:
        if call.keys is not None and keys is getattr(call.request, "keys", None):
            keys = call.keys
        for key in keys:
            if call.foreign(key):
                raise call.deny(f"touch {key!r} outside tenant {call.ident.tenant or 'default'!r}")


def _put_start(call: Call) -> None:
    _writer(call)
    if call.ident.scoped:
        cols = call.items
        keys = cols.keys if cols is not None else [it.key for it in call.request.items]
        groups = cols.groups if cols is not None else [it.group for it in call.request.items]
        _own_keys(call, keys)
        _own_keys(call, [g for g in groups if g])


def _commit_extent(call: Call) -> None:
    _put_start(call)


def _put_keys(call: Call) -> None:
    _writer(call)
    _own_keys(call, call.request.keys)


def _remove(call: Call) -> None:
    if call.request.force and not call.ident.admin:
        raise call.deny("force a remove")
    _reader(call)
    _own_keys(call, call.request.keys)
    if call.free or call.ident.admin:
        return
    objects = call.state.objects
    for key in call.keys if call.keys is not None else call.request.keys:
        i = objects.index.find(key)
        if i >= 0:
            writer = objects.writer_names[objects.writer_v[i]]
            if writer and writer != call.ident.id:
                raise call.deny(f"remove {key!r}, written by another client")


def _lookup(call: Call) -> Post | None:
    _reader(call)
    if not call.ident.scoped:
        return None
    request, ns = call.request, call.ident.namespace
    if len(request.cached_reads) != len(request.cached_keys):
        raise BadRequestError("BatchLookup needs one cached_reads per cached_keys")
    if any(not k.startswith(ns) for k in request.cached_keys):
        # reads reported from the client's location cache move hit counters and
        # promotion: only the tenant's own keys count (a foreign one is dropped, as a
        # report of a key nobody holds a lease on is)
        cached = [
            (k, n)
            for k, n in zip(request.cached_keys, request.cached_reads, strict=True)
            if k.startswith(ns)
        ]
        del request.cached_keys[:], request.cached_reads[:]
        request.cached_keys.extend(k for k, _ in cached)
        request.cached_reads.extend(n for _, n in cached)
    keys = request.keys
    every = call.keys if call.keys is not None else list(keys)
    foreign = [i for i, k in enumerate(every) if not k.startswith(ns)]
    if not foreign:
        return None
    del keys[:]
    keys.extend(k for k in every if k.startswith(ns))
    if not request.no_lease:
        call.state.counters.misses += len(foreign)  # as the core counts a real miss
    return lambda reply: _merge_misses(reply, every, set(foreign))


def _merge_misses(reply: Any, every: list[str], foreign: set[int]) -> Any:
    """The reply with a miss, worded as the core words one, at each foreign position;
    `moving` (indices into the tenant's own keys) re-indexed into `every`."""
    out = master_pb2.BatchLookupResponse(
        lease_ttl_ms=reply.lease_ttl_ms, promote_after=reply.promote_after
    )
    own = iter(reply.results)
    positions = []  # position in `every` of each of the tenant's own keys
    for i, key in enumerate(every):
        if i in foreign:
            out.results.append(miss_result(key))
        else:
            out.results.append(next(own))
            positions.append(i)
    out.moving.extend(positions[j] for j in reply.moving)
    return out


def miss_result(key: str) -> master_pb2.LookupResult:
    from kvstore.rpc_errors import code_for

    err = NotFoundError(f"unknown key {key!r}")
    status = master_pb2.KeyStatus(code=code_for(err), message=str(err))  # type: ignore[arg-type]  # proto enum: an int
    return master_pb2.LookupResult(status=status)


def _match(call: Call) -> None:
    if not call.ident.scoped:
        return
    keys = call.request.keys
    for i, key in enumerate(keys):
        if call.foreign(key):  # a miss ends every prefix: the rest cannot count
            del keys[i:]
            return


def _list(call: Call) -> None:
    if not call.ident.scoped:
        return
    ns, r = call.ident.namespace, call.request
    if r.prefix.startswith(ns):
        return
    if ns.startswith(r.prefix):
        r.prefix = ns
        return
    raise Answer(master_pb2.ListObjectsResponse())  # none of its keys has that prefix


def _inspect(call: Call) -> None:
    if call.ident.role == "node":
        raise call.deny("inspect objects")
    if call.foreign(call.request.key):
        raise NotFoundError(f"unknown key {call.request.key!r}")


def _report(call: Call) -> None:
    r, ident = call.request, call.ident
    if ident.role == "node":
        if any(loc.node_id != ident.id for loc in r.replicas):
            raise call.deny("report another node's replicas")
        return
    if ident.scoped and any(call.foreign(k) for k in r.keys):
        pairs = [(k, c) for k, c in zip(r.keys, r.replicas, strict=False) if not call.foreign(k)]
        del r.keys[:]
        del r.replicas[:]
        r.keys.extend(k for k, _ in pairs)
        r.replicas.extend(loc for _, loc in pairs)


def _anyone(call: Call) -> None:
    return None


RULES: dict[str, Callable[[Call], Post | None]] = {
    "RegisterNode": _node_self, "Heartbeat": _node_self, "MountSegment": _node_self,
    "NodeTasks": _node_self, "AnnounceObjects": _node_self, "UnmountSegment": _unmount,
    "PutStart": _put_start, "PutEnd": _put_keys, "PutRevoke": _put_keys,
    "GrantExtent": _writer, "CommitExtent": _commit_extent,
    "BatchLookup": _lookup, "MatchPrefix": _match, "ListObjects": _list, "Inspect": _inspect,
    "ReportCorrupt": _report, "ReportUnreachable": _reader, "Remove": _remove,
    "Stats": _anyone,
    "Evict": _admin, "Pin": _admin, "Unpin": _admin, "Cordon": _admin,
}  # fmt: skip
