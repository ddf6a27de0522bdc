"""Groups (the eviction unit) in LRU order, and which of them may be evicted.

A group is every key written under one group name (e.g. all layers of one
block); a key without a group is a group of its own. Eviction takes a whole
group or nothing, and only when every member is COMPLETE (no in-flight write)
and none holds a live lease or pin.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from itertools import islice

from kvstore.master.model import ObjectMeta, ObjectState


class GroupIndex:
    """Members of each group, least recently used group first."""

    def __init__(self) -> None:
        self._members: dict[str, set[str]] = {}
        self._lru: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._members)

    def add(self, group: str, key: str) -> None:
        self._members.setdefault(group, set()).add(key)
        self._lru[group] = None
        self._lru.move_to_end(group)

    def discard(self, group: str, key: str) -> None:
        members = self._members.get(group)
        if members is None:
            return
        members.discard(key)
        if not members:
            del self._members[group]
            del self._lru[group]

    def touch(self, group: str) -> None:
        """Mark `group` most recently used."""
        if group in self._lru:
            self._lru.move_to_end(group)

    def members(self, group: str) -> frozenset[str]:
        return frozenset(self._members.get(group, ()))

    def oldest_first(self) -> list[str]:
        """A snapshot of group names, least recently used first."""
        return list(self._lru)

    def oldest(self, limit: int) -> list[str]:
        """The `limit` least recently used group names (a snapshot: O(limit), not O(n))."""
        return list(islice(self._lru, limit))

    def check_integrity(self, objects: Mapping[str, ObjectMeta]) -> None:
        assert set(self._members) == set(self._lru), "LRU and membership disagree"
        seen = 0
        for group, members in self._members.items():
            assert members, f"empty group {group!r}"
            for key in members:
                assert objects[key].group == group, f"{key!r} is not in group {group!r}"
            seen += len(members)
        assert seen == len(objects), f"{seen} grouped keys != {len(objects)} objects"


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
