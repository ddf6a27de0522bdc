"""Re-adopting what a restarted node's durable segment still holds.

A node restarted with the same node id and SSD directory reopens its slab and
index, verifies every object's checksum, and lists the survivors here. The
master adopts each one it can place exactly where the node says it is:

- unknown to the master (e.g. the master restarted without its journal): a new
  COMPLETE object with that replica;
- known, with a replica at that very range: nothing to do (`known`);
- known elsewhere with the same checksum: one more replica, when the node holds
  no other replica of it;
- a key the master dropped while the node was away, whose FORGET the node
  never got (it restarted or died first; `Tiering.tombstones`): refused, so a
  removed object does not come back with its node;
- anything else (another checksum: newer data under the key; a range that
  overlaps live data): refused, and the node forgets it.

With `complete`, replicas the master lists in that segment but the node did not
announce are dropped: their bytes are not there any more (never committed to the
index before the node died). WRITING objects are left alone: their writer may
still be writing into the new incarnation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvstore.errors import BadRequestError, KVStoreError
from kvstore.master.model import ObjectMeta, ObjectState
from kvstore.master.tiering import is_durable
from kvstore.types import Location, check_key

if TYPE_CHECKING:
    from kvstore.master.metadata import MasterState

Found = tuple[str, int, int, int]  # key, offset, length, checksum


def adopt(
    state: MasterState, node_id: str, name: str, found: Sequence[Found], complete: bool
) -> tuple[int, int, int, list[str]]:
    """(adopted, known, dropped, refused keys); see the module docstring."""
    seg = state.registry.segment(node_id, name)
    if not is_durable(seg.tier):
        raise BadRequestError(f"segment {name!r} is {seg.tier.name}: only durable tiers announce")
    adopted = known = 0
    refused: list[str] = []
    listed: set[str] = set()
    graves = state.tiering.tombstones.get(node_id, set())
    for key, offset, length, checksum in found:
        if key in graves and key not in state.objects:  # removed while the node was away
            graves.discard(key)
            refused.append(key)
            continue
        outcome = _adopt_one(state, seg.node_id, seg.name, key, offset, length, checksum)
        if outcome == "refused":
            refused.append(key)
            continue
        listed.add(key)
        adopted += outcome == "adopted"
        known += outcome == "known"
    dropped = _drop_unlisted(state, node_id, name, listed) if complete else 0
    if complete:  # the node listed everything it holds: no grave is needed any more
        state.tiering.tombstones.pop(node_id, None)
    state.counters.adopted += adopted
    return adopted, known, dropped, refused


def _adopt_one(
    state: MasterState, node_id: str, name: str, key: str, offset: int, length: int,
    checksum: int,
) -> str:  # fmt: skip
    seg = state.registry.segment(node_id, name)
    try:
        check_key(key)
    except KVStoreError:
        return "refused"
    if length <= 0 or offset + length > seg.capacity:
        return "refused"
    loc = Location(node_id, seg.tier, name, offset, length)
    obj = state.objects.get(key)
    if obj is not None:
        return _merge(state, obj, loc, checksum)
    try:
        seg.allocator.allocate_at(offset, length)
    except BadRequestError:
        return "refused"  # overlaps live data placed since the node went away
    obj = state._new_object(
        key, length, key, ObjectState.COMPLETE, [loc], "", state.clock(), checksum
    )
    state.journal.save_object(obj)
    return "adopted"


def _merge(state: MasterState, obj: ObjectMeta, loc: Location, checksum: int) -> str:
    here = [r for r in obj.replicas if r.node_id == loc.node_id]
    if any((r.segment, r.offset, r.length) == (loc.segment, loc.offset, loc.length) for r in here):
        if not obj.checksum:
            obj.checksum = checksum
        elif obj.checksum != checksum:
            return "refused"
        return "known"
    if here or obj.state is not ObjectState.COMPLETE or obj.size != loc.length:
        return "refused"
    if not checksum or obj.checksum != checksum:
        return "refused"
    seg = state.registry.segment(loc.node_id, loc.segment)
    try:
        seg.allocator.allocate_at(loc.offset, loc.length)
    except BadRequestError:
        return "refused"
    state.add_replica(obj, loc)
    return "known"


def _drop_unlisted(state: MasterState, node_id: str, name: str, listed: set[str]) -> int:
    seg = state.registry.segment(node_id, name)
    dropped = 0
    for key in sorted(seg.keys - listed):
        obj = state.objects[key]
        if obj.state is not ObjectState.COMPLETE:
            continue
        for loc in [r for r in obj.replicas if (r.node_id, r.segment) == (node_id, name)]:
            state.drop_replica(obj, loc)
            dropped += 1
    state.counters.dropped_replicas += dropped
    return dropped
