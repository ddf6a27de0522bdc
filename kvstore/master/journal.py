"""Where the master's metadata is made durable: a small interface and its stores.

The master calls the journal on every change that must survive a restart
(nodes, segments, objects, extents). `NullJournal` keeps nothing (a restart
starts empty and nodes re-register); `RocksJournal` writes to a RocksDB file
with its WAL on and reloads it at start, so a restarted master keeps what was
committed instead of orphaning the bytes on the nodes.

Space someone may still be writing into one-sidedly is journaled too, not only
what was committed: an object in WRITING (from its PutStart until its PutEnd),
every extent lease (from its grant until it ends) and the destination of every
tier COPY (from when a node is handed it until it ends). A successor that did not
know them would hand the same bytes to another writer while the first one's writes
are still landing there (docs/reliability.md, bug 4).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvstore.master.extents import Extent
from kvstore.master.model import NodeInfo, ObjectMeta, ObjectState, Segment
from kvstore.master.tiering import Move


@dataclass(slots=True)
class Snapshot:
    """What a journal held at load time, as plain records."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)
    extents: list[dict[str, Any]] = field(default_factory=list)
    moves: list[dict[str, Any]] = field(default_factory=list)


class MetaJournal(Protocol):
    def save_node(self, node: NodeInfo) -> None: ...
    def drop_node(self, node_id: str) -> None: ...
    def save_segment(self, seg: Segment) -> None: ...
    def drop_segment(self, node_id: str, name: str) -> None: ...
    def save_object(self, obj: ObjectMeta) -> None: ...
    def drop_object(self, key: str) -> None: ...
    def save_extents(self, client_id: str, extents: Sequence[Extent]) -> None: ...
    def save_move(self, move: Move) -> None: ...
    def drop_move(self, task_id: int) -> None: ...
    def load(self) -> Snapshot: ...
    def close(self) -> None: ...


class NullJournal:
    """Keeps nothing: the in-memory master."""

    def save_node(self, node: NodeInfo) -> None:
        pass

    def drop_node(self, node_id: str) -> None:
        pass

    def save_segment(self, seg: Segment) -> None:
        pass

    def drop_segment(self, node_id: str, name: str) -> None:
        pass

    def save_object(self, obj: ObjectMeta) -> None:
        pass

    def drop_object(self, key: str) -> None:
        pass

    def save_extents(self, client_id: str, extents: Sequence[Extent]) -> None:
        pass

    def save_move(self, move: Move) -> None:
        pass

    def drop_move(self, task_id: int) -> None:
        pass

    def load(self) -> Snapshot:
        return Snapshot()

    def close(self) -> None:
        pass


_NODE, _SEG, _OBJ, _EXT, _MOVE = b"n/", b"s/", b"o/", b"x/", b"m/"


# ---- records: one (key, JSON value) per node, segment, object, extent and move ----
# Shared by every journal (RocksDB here, etcd in kvstore.master.ha) and by MasterState.restore.


def node_key(node_id: str) -> bytes:
    return _NODE + node_id.encode()


def segment_key(node_id: str, name: str) -> bytes:
    return _SEG + _seg_key(node_id, name)


def object_key(key: str) -> bytes:
    return _OBJ + key.encode()


def extents_key(client_id: str) -> bytes:
    return _EXT + client_id.encode()


def move_key(task_id: int) -> bytes:
    return _MOVE + str(task_id).encode()


def node_record(node: NodeInfo) -> bytes:
    ep = node.endpoint
    rec = {"id": node.node_id, "tcp": ep.tcp_address, "shm": ep.shm_host_id}
    rec["rpc"] = ep.rpc_address
    rec["nixl"] = base64.b64encode(ep.nixl_metadata).decode()
    rec["fd"] = ep.shm_socket
    return _dump(rec)


def segment_record(seg: Segment) -> bytes:
    rec = {"node": seg.node_id, "name": seg.name, "tier": int(seg.tier)}
    rec.update(capacity=seg.capacity, alignment=seg.alignment, shm=seg.shm)
    return _dump(rec)


def object_record(obj: ObjectMeta) -> bytes:
    reps = [[r.node_id, int(r.tier), r.segment, r.offset, r.length] for r in obj.replicas]
    rec = {"key": obj.key, "size": obj.size, "group": obj.group, "replicas": reps}
    if obj.checksum:
        rec["checksum"] = obj.checksum
    writer = obj.writer
    if writer:  # a retried PutEnd of it still commits; another client may not remove it
        rec["writer"] = writer
    if obj.state is ObjectState.WRITING:  # its writer may still be writing its bytes
        rec["writing"] = True
    return _dump(rec)


def extents_record(client_id: str, extents: Sequence[Extent]) -> bytes | None:
    """A client's live extents, each its whole range granted (a successor keeps every
    part of it that no object holds); None (delete the record) when it has none."""
    if not extents:
        return None
    rows = [[e.extent_id, e.node_id, e.segment, e.start, e.size] for e in extents]
    return _dump({"client": client_id, "extents": rows})


def move_record(move: Move) -> bytes:
    """A COPY's destination range: a successor holds it until the node reports."""
    dst = move.dst
    rec = {"id": move.task_id, "key": move.key, "node": dst.node_id, "tier": int(dst.tier)}
    rec.update(segment=dst.segment, offset=dst.offset, length=dst.length)
    return _dump(rec)


def snapshot_of(items: Iterable[tuple[bytes, bytes]]) -> Snapshot:
    """A Snapshot of journal records given as (key, value) pairs, keys unprefixed."""
    snap = Snapshot()
    lists = {_NODE: snap.nodes, _SEG: snap.segments, _OBJ: snap.objects}
    lists.update({_EXT: snap.extents, _MOVE: snap.moves})
    for key, value in items:
        lists[bytes(key)[:2]].append(json.loads(bytes(value)))
    return snap


def _dump(rec: dict[str, Any]) -> bytes:
    return json.dumps(rec, separators=(",", ":")).encode()


class RocksJournal:
    """Metadata in RocksDB (rocksdict, raw mode, WAL on); JSON values, prefixed keys."""

    def __init__(self, path: str) -> None:
        from rocksdict import Options, Rdict

        self._db = Rdict(path, Options(raw_mode=True))

    def save_node(self, node: NodeInfo) -> None:
        self._db[node_key(node.node_id)] = node_record(node)

    def drop_node(self, node_id: str) -> None:
        self._db.delete(node_key(node_id))

    def save_segment(self, seg: Segment) -> None:
        self._db[segment_key(seg.node_id, seg.name)] = segment_record(seg)

    def drop_segment(self, node_id: str, name: str) -> None:
        self._db.delete(segment_key(node_id, name))

    def save_object(self, obj: ObjectMeta) -> None:
        self._db[object_key(obj.key)] = object_record(obj)

    def drop_object(self, key: str) -> None:
        self._db.delete(object_key(key))

    def save_extents(self, client_id: str, extents: Sequence[Extent]) -> None:
        value = extents_record(client_id, extents)
        if value is None:
            self._db.delete(extents_key(client_id))
        else:
            self._db[extents_key(client_id)] = value

    def save_move(self, move: Move) -> None:
        self._db[move_key(move.task_id)] = move_record(move)

    def drop_move(self, task_id: int) -> None:
        self._db.delete(move_key(task_id))

    def load(self) -> Snapshot:
        return snapshot_of(self._db.items())  # type: ignore[arg-type]  # bytes pairs; its stub says otherwise

    def close(self) -> None:
        self._db.close()


def _seg_key(node_id: str, name: str) -> bytes:
    return json.dumps([node_id, name]).encode()
