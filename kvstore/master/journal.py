"""Where the master's metadata is made durable: a small interface and its stores.

The master calls the journal on every change that must survive a restart
(nodes, segments, committed objects). `NullJournal` keeps nothing (a restart
starts empty and nodes re-register); `RocksJournal` writes to a RocksDB file
with its WAL on and reloads it at start, so a restarted master keeps what was
committed instead of orphaning the bytes on the nodes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvstore.master.model import NodeInfo, ObjectMeta, Segment


@dataclass(slots=True)
class Snapshot:
    """What a journal held at load time, as plain records."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)


class MetaJournal(Protocol):
    def save_node(self, node: NodeInfo) -> None: ...
    def drop_node(self, node_id: str) -> None: ...
    def save_segment(self, seg: Segment) -> None: ...
    def drop_segment(self, node_id: str, name: str) -> None: ...
    def save_object(self, obj: ObjectMeta) -> None: ...
    def drop_object(self, key: str) -> None: ...
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

    def load(self) -> Snapshot:
        return Snapshot()

    def close(self) -> None:
        pass


_NODE, _SEG, _OBJ = b"n/", b"s/", b"o/"


# ---- records: one (key, JSON value) per node, segment and committed object --------
# Shared by every journal (RocksDB here, etcd in kvstore.master.ha) and by MasterState.restore.


def node_key(node_id: str) -> bytes:
    return _NODE + node_id.encode()


def segment_key(node_id: str, name: str) -> bytes:
    return _SEG + _seg_key(node_id, name)


def object_key(key: str) -> bytes:
    return _OBJ + key.encode()


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
    return _dump(rec)


def snapshot_of(items: Iterable[tuple[bytes, bytes]]) -> Snapshot:
    """A Snapshot of journal records given as (key, value) pairs, keys unprefixed."""
    snap = Snapshot()
    lists = {_NODE: snap.nodes, _SEG: snap.segments, _OBJ: snap.objects}
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

    def load(self) -> Snapshot:
        return snapshot_of(self._db.items())  # type: ignore[arg-type]  # bytes pairs; its stub says otherwise

    def close(self) -> None:
        self._db.close()


def _seg_key(node_id: str, name: str) -> bytes:
    return json.dumps([node_id, name]).encode()
