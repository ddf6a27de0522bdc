"""Groups (the eviction unit) in LRU order, and which of them may be evicted.

A group is every key written under one group name (e.g. all layers of one
block); a key without a group is a group of its own. Eviction takes a whole
group or nothing, and only when every member is COMPLETE (no in-flight write)
and none holds a live lease or pin.

Storage (no Python object per group of one, the common case): a group of one is
its object's row (`group` column -1). A named group (one whose name is not its
only member's key) has a gid: its name and member ids. LRU order is a log of
touches: each touch appends the group's node (the row id of a group of one,
~gid of a named group) and records that log position as the group's (`lru`
column, `_gpos`); an entry is live iff its position is still its group's, so
oldest-first is the live entries from the head. The log is compacted (dead
entries dropped, positions renumbered) when it fills, never while an
`oldest_first()` iteration is open.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from kvstore.master.keyindex import zeros
from kvstore.master.model import ObjectMeta, ObjectState
from kvstore.master.objects import ObjectTable

_I64 = np.int64
CHUNK = 4096  # log entries examined per step


class GroupIndex:
    """Members of each group, least recently used group first."""

    def __init__(self, table: ObjectTable) -> None:
        self._t = table
        self._named: dict[str, int] = {}  # name -> gid
        self._names: dict[int, str] = table.group_names  # gid -> name
        self._members: dict[int, set[int]] = {}  # gid -> member row ids
        self._gpos = np.full(64, -1, _I64)  # gid -> log position of its last touch
        self._free_gids: list[int] = []
        self._next_gid = 0
        self._grouped = 0  # rows that belong to named groups
        self._log = np.zeros(1024, np.int32)
        self._log_v = self._log.data
        self._head = self._tail = 0
        self._base = 0  # log position of _log[0]
        self._iterating = 0  # open oldest_first() iterations (no compaction meanwhile)

    def __len__(self) -> int:
        return len(self._t) - self._grouped + len(self._members)

    # ---- membership -----------------------------------------------------------

    def add_many(self, ids: np.ndarray, keys: Sequence[str], groups: Sequence[str] | None) -> None:
        """New rows `ids` (keys `keys`) join their groups ("" or the key: its own), each
        group touched in order."""
        grouped = groups is not None and any(
            g and g != k for g, k in zip(groups, keys, strict=True)
        )
        if grouped or self._named:
            gcol = self._t.group_v
            for j, i in enumerate(ids.tolist()):
                name = groups[j] if groups is not None and groups[j] else keys[j]
                if gcol[i] < 0 and (name != keys[j] or name in self._named):
                    gcol[i] = self._join(name, i)  # (>= 0: it joined as a group's namesake)
        self.touch_ids(ids)

    def add(self, group: str, key: str) -> None:
        self.add_one(self._t.index.find(key), key, group)

    def add_one(self, i: int, key: str, group: str) -> None:
        """`add_many` of one row, without numpy."""
        name = group or key
        if name != key or name in self._named:
            self._t.group_v[i] = self._join(name, i)
        self.touch_node(~self._t.group_v[i] if self._t.group_v[i] >= 0 else i)

    def _join(self, name: str, i: int) -> int:
        gid = self._named.get(name)
        if gid is None:
            gid = self._new_gid(name)
            own = self._t.index.find(name)  # an object named like the group: it joins too
            if own >= 0 and own != i and self._t.group_v[own] < 0:
                self._t.group_v[own] = gid
                self._t.lru_v[own] = -1
                self._members[gid].add(own)
                self._grouped += 1
        self._members[gid].add(i)
        self._grouped += 1
        return gid

    def _new_gid(self, name: str) -> int:
        if self._free_gids:
            gid = self._free_gids.pop()
        else:
            gid = self._next_gid
            self._next_gid += 1
            if gid >= len(self._gpos):
                self._gpos = np.concatenate([self._gpos, np.full(len(self._gpos), -1, _I64)])
        self._named[name] = gid
        self._names[gid] = name
        self._members[gid] = set()
        return gid

    def discard_id(self, i: int) -> None:
        """Row `i` leaves its group (an emptied group is gone)."""
        t = self._t
        gid = t.group_v[i]
        t.lru_v[i] = -1
        if gid < 0:
            return
        t.group_v[i] = -1
        members = self._members[gid]
        members.discard(i)
        self._grouped -= 1
        if not members:
            del self._members[gid], self._named[self._names.pop(gid)]
            self._gpos[gid] = -1
            self._free_gids.append(gid)

    def discard(self, group: str, key: str) -> None:
        i = self._t.index.find(key)
        if i >= 0:
            self.discard_id(i)

    # ---- names and nodes ------------------------------------------------------

    def node_of(self, group: str) -> int | None:
        """The LRU node of `group` (row id or ~gid), None when no such group."""
        gid = self._named.get(group)
        if gid is not None:
            return ~gid
        i = self._t.index.find(group)
        return i if i >= 0 and self._t.group_v[i] < 0 else None

    def name_of(self, node: int) -> str:
        return self._names[~node] if node < 0 else self._t.index.key_of(node)

    def member_ids(self, node: int) -> list[int]:
        return sorted(self._members[~node]) if node < 0 else [node]

    def members(self, group: str) -> frozenset[str]:
        node = self.node_of(group)
        if node is None:
            return frozenset()
        if node >= 0:
            return frozenset((group,))
        return frozenset(self._t.index.key_of(i) for i in self._members[~node])

    # ---- LRU ------------------------------------------------------------------

    def touch(self, group: str) -> None:
        """Mark `group` most recently used."""
        node = self.node_of(group)
        if node is not None:
            self.touch_node(node)

    def touch_node(self, node: int) -> None:
        """Touch one group by its node (row id, or ~gid), without numpy."""
        if self._tail + 1 > len(self._log):
            self._make_room(1)
        self._log_v[self._tail] = node
        pos = self._base + self._tail
        self._tail += 1
        if node >= 0:
            self._t.lru_v[node] = pos
        else:
            self._gpos[~node] = pos

    def touch_id(self, i: int) -> None:
        """`touch_ids` of one row, without numpy."""
        g = int(self._t.group_v[i])
        self.touch_node(i if g < 0 else ~g)

    def touch_ids(self, ids: np.ndarray) -> None:
        """Touch the groups of rows `ids`, in order (the last touch of a group counts)."""
        if len(ids):
            g = self._t.col["group"][ids]
            self._append(np.where(g < 0, ids, ~g.astype(_I64)).astype(np.int32))

    def _append(self, nodes: np.ndarray) -> None:
        n = len(nodes)
        if self._tail + n > len(self._log):
            self._make_room(n)
        self._log[self._tail : self._tail + n] = nodes
        pos = np.arange(self._base + self._tail, self._base + self._tail + n, dtype=_I64)
        self._tail += n
        self._set_pos(nodes, pos)

    def _set_pos(self, nodes: np.ndarray, pos: np.ndarray, unique: bool = False) -> None:
        """Record `pos` as each node's position; a node listed twice keeps its last
        (positions only grow, so the last is the largest: `maximum.at`)."""
        objs = nodes >= 0
        lru, gpos = self._t.col["lru"], self._gpos
        obj_nodes, grp_nodes = nodes[objs], ~nodes[~objs].astype(_I64)
        if unique:
            lru[obj_nodes] = pos[objs]
            gpos[grp_nodes] = pos[~objs]
        else:
            np.maximum.at(lru, obj_nodes, pos[objs])
            np.maximum.at(gpos, grp_nodes, pos[~objs])

    def _current(self, nodes: np.ndarray) -> np.ndarray:
        """The log position each node's group holds now (-1: gone)."""
        out = np.empty(len(nodes), _I64)
        objs = nodes >= 0
        out[objs] = self._t.col["lru"][nodes[objs]]
        out[~objs] = self._gpos[~nodes[~objs].astype(_I64)]
        return out

    def _pos_of(self, node: int) -> int:
        return self._t.lru_v[node] if node >= 0 else int(self._gpos[~node])

    def _live(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(nodes, positions) of the live entries among log[start:stop]."""
        nodes = self._log[start:stop]
        pos = np.arange(self._base + start, self._base + stop, dtype=_I64)
        keep = self._current(nodes) == pos
        return nodes[keep], pos[keep]

    def _make_room(self, n: int) -> None:
        if not self._iterating:
            self._compact()
        need = self._tail + n
        if need > 0.75 * len(self._log) or need > len(self._log):
            grown = zeros(max(2 * len(self._log), 2 * need), np.int32)
            grown[: self._tail] = self._log[: self._tail]
            self._log = grown
            self._log_v = grown.data

    def _compact(self) -> None:
        """Keep live entries only, at the front; positions move on past all old ones."""
        parts = [
            self._live(s, min(s + CHUNK, self._tail)) for s in range(self._head, self._tail, CHUNK)
        ]
        nodes = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int32)
        base = self._base + self._tail
        self._log[: len(nodes)] = nodes
        self._base, self._head, self._tail = base, 0, len(nodes)
        self._set_pos(nodes, np.arange(base, base + len(nodes), dtype=_I64), unique=True)

    def oldest_nodes(self, limit: int) -> list[int]:
        """The `limit` least recently used groups' nodes (dead entries at the head go)."""
        out: list[int] = []
        start = self._head
        while len(out) < limit and start < self._tail:
            stop = min(start + CHUNK, self._tail)
            nodes, pos = self._live(start, stop)
            if not out and not self._iterating:
                self._head = int(pos[0] - self._base) if len(pos) else stop
            out.extend(nodes[: limit - len(out)].tolist())
            start = stop
        return out

    def oldest(self, limit: int) -> list[str]:
        """The `limit` least recently used group names (a snapshot: O(limit), not O(n))."""
        return [self.name_of(n) for n in self.oldest_nodes(limit)]

    def oldest_first(self) -> Iterator[str]:
        """Group names, least recently used first, as of the call (lazily; groups that
        leave meanwhile are skipped)."""
        self._iterating += 1
        try:
            start, end = self._head, self._tail
            while start < end:
                stop = min(start + CHUNK, end)
                nodes, pos = self._live(start, stop)
                for node, p in zip(nodes.tolist(), pos.tolist(), strict=True):
                    if self._pos_of(node) == p:  # still there, not touched since
                        yield self.name_of(node)
                start = stop
        finally:
            self._iterating -= 1

    # ---- eviction checks ------------------------------------------------------

    def evictable(self, node: int, now: float) -> bool:
        """True when every member of the group is COMPLETE and unprotected."""
        t = self._t
        for i in self.member_ids(node):
            if t.state_v[i] != ObjectState.COMPLETE or t.lease_v[i] > now or t.pin_v[i] > now:
                return False
        return True

    # ---- integrity ------------------------------------------------------------

    def check_integrity(self, objects: Mapping[str, ObjectMeta]) -> None:
        t = self._t
        live = t.live_ids()
        g = t.col["group"][live]
        alone = live[g < 0]
        assert len(alone) + self._grouped == len(live), "grouped row count"
        for gid, members in self._members.items():
            assert members, f"empty group {self._names[gid]!r}"
            assert self._named[self._names[gid]] == gid, "group name index"
            for i in members:
                assert t.group_v[i] == gid and t.state_v[i] != 255, f"row {i} not in {gid}"
        assert sum(len(m) for m in self._members.values()) == self._grouped, "member count"
        assert len(self._named) == len(self._members) == len(self._names), "group tables"
        names = set(t.index.keys_of(alone))
        assert not names & set(self._named), "a key is its own group and a named one"
        nodes = np.concatenate([alone, ~np.array(sorted(self._members), _I64)]).astype(np.int32)
        cur = self._current(nodes)
        assert (cur >= self._base + self._head).all(), "a group has no live log entry"
        assert (cur < self._base + self._tail).all(), "a group's entry is past the log"
        assert (self._log[cur - self._base] == nodes).all(), "a group's entry names another"
        live_entries = sum(len(self._live(s, min(s + CHUNK, self._tail))[0])
                           for s in range(self._head, self._tail, CHUNK))  # fmt: skip
        assert live_entries == len(nodes) == len(self), "live log entries != groups"
        for key in list(objects)[:256]:
            assert key in self.members(objects[key].group), f"{key!r} not in its group"


def group_evictable(members: frozenset[str], objects: Mapping[str, ObjectMeta], now: float) -> bool:
    """True when every member is COMPLETE and unprotected."""
    for key in members:
        obj = objects[key]
        if obj.state is not ObjectState.COMPLETE or obj.protected(now):
            return False
    return True


def evictable_groups(
    groups: GroupIndex, objects: Mapping[str, ObjectMeta], now: float
) -> Iterator[str]:
    """Evictable groups, least recently used first (re-checked lazily as callers evict)."""
    for group in groups.oldest_first():
        members = groups.members(group)
        if members and group_evictable(members, objects, now):
            yield group
