"""What the master accepts: sizes of every string a caller sends, batch sizes, counts of
nodes, segments and objects, segment capacities, and the size of replies before they are
built. Synchronous, no grpc: `kvstore.security.guard` calls `Limits.check` per RPC.

Every limit is a MasterConfig field with a default (kvstore/master/config.py, "Limits");
a size over its limit is BadRequestError (INVALID_ARGUMENT), a reply that would pass the
message cap TooLargeError (INVALID_ARGUMENT, split the batch), a count or memory bound
NoSpaceError (RESOURCE_EXHAUSTED). A refused call changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from kvstore.errors import BadRequestError, NoSpaceError, TooLargeError
from kvstore.types import Tier
from kvstore.v1 import common_pb2

MAX_ALIGNMENT = 1 << 30
MAX_POLL_MS = 30_000
TIERS = frozenset(int(t) for t in Tier)
ERROR_CODES = frozenset(common_pb2.ErrorCode.values())  # NodeTasks long polls are clamped to this
REPLY_MARGIN = 64 << 10  # headroom under max_message_bytes for a reply's framing
LOCATION_OVERHEAD = 40  # tags, tier, offset and length varints of one Location
RESULT_OVERHEAD = 48  # a per-key status and its message's fixed text
ITEM_OVERHEAD = 40  # a PutStartItem's tags and varints, beyond its strings
MAX_REPLICAS = 18  # 16 requested + a faster-tier copy and a slower-tier copy
_POSITIVE = (
    "max_key_bytes", "max_id_bytes", "max_group_bytes", "max_segment_name_bytes",
    "max_address_bytes", "max_nixl_metadata_bytes", "max_segment_bytes", "max_nodes",
    "max_segments_per_node", "max_objects", "max_metadata_bytes",
)  # fmt: skip


def check_config(cfg: Any) -> None:
    """MasterConfig's limit fields are usable (called from its __post_init__)."""
    for name in _POSITIVE:
        value = getattr(cfg, name)
        if not isinstance(value, int) or value <= 0:
            raise BadRequestError(f"MasterConfig.{name} must be an int > 0, got {value!r}")
    if cfg.max_segment_bytes * cfg.max_nodes * cfg.max_segments_per_node >= 1 << 64:
        raise BadRequestError("max_segment_bytes x max_nodes x max_segments_per_node must fit u64")
    if cfg.tenant_quota_bytes < 0:
        raise BadRequestError("tenant_quota_bytes must be >= 0")
    for entry in cfg.tenant_quotas:
        if len(entry) != 2 or not isinstance(entry[0], str) or int(entry[1]) < 0:
            raise BadRequestError(f"tenant_quotas entry {entry!r}: want (tenant, bytes >= 0)")


def check_enum(what: str, value: int, known: frozenset[int]) -> None:
    """An enum field of a known value (the core maps it by name or to a Tier)."""
    if value not in known:
        raise BadRequestError(f"unknown {what} {value}")


def _too_long(what: str, value: str | bytes, limit: int) -> BadRequestError:
    size = len(value.encode()) if isinstance(value, str) else len(value)
    return BadRequestError(f"{what} of {size} bytes exceeds the limit of {limit}")


def check_str(what: str, value: str, limit: int) -> None:
    """One string: at most `limit` UTF-8 bytes, no NUL."""
    if len(value) * 4 > limit and (len(value) > limit or len(value.encode()) > limit):
        raise _too_long(what, value, limit)
    if "\x00" in value:
        raise BadRequestError(f"{what} must not contain NUL")


def check_strs(what: str, values: Iterable[str], limit: int, hint: int) -> None:
    """Every string of a repeated field; `hint` (the request's ByteSize) <= limit: all fit."""
    if hint <= limit:
        return
    if isinstance(values, list) and max(map(len, values), default=0) * 4 <= limit:
        return  # (a list: one C pass; a repeated field would build each str again)
    quarter = limit // 4
    for v in values:
        if len(v) > quarter and (len(v) > limit or len(v.encode()) > limit):
            raise _too_long(what, v, limit)


def check_col(what: str, values: Sequence[str], limit: int) -> None:
    """`check_str` of every string of a column, in C passes unless one may be too long."""
    if not values:
        return
    if max(map(len, values)) * 4 > limit:
        for v in values:
            check_str(what, v, limit)
    elif "\x00" in "".join(values):
        raise BadRequestError(f"{what} must not contain NUL")


@dataclass(frozen=True, slots=True)
class Items:
    """A PutStart or CommitExtent batch's fields as columns, read off the request once:
    the guard shares them between the limits and the quota check (reading a protobuf
    field costs ~0.1 us, and these checks must stay small beside the put itself)."""

    keys: Sequence[str]
    groups: Sequence[str]
    sizes: Sequence[int]
    replicas: Sequence[int]  # as asked (0 = one)
    nodes: Sequence[str]  # preferred nodes ("" each for a commit)

    @staticmethod
    def of(method: str, items: Any) -> Items:
        """A request's items (the guard reads a PutStart's with the servicer: `of_put`)."""
        if method == "PutStart":
            rows5 = [(it.key, it.group, it.size, it.replicas, it.preferred_node) for it in items]
            return Items(*(tuple(zip(*rows5, strict=True)) if rows5 else ((),) * 5))
        rows = [(it.key, it.group, it.size) for it in items]
        keys, groups, sizes = tuple(zip(*rows, strict=True)) if rows else ((),) * 3
        return Items(keys, groups, sizes, (1,) * len(keys), ("",) * len(keys))

    @staticmethod
    def of_put(cols: Any) -> Items:
        """A PutStart's items from the master's own columns (kvstore.master.batch)."""
        return Items(cols.keys, cols.groups, cols.sizes, cols.replicas, cols.preferred)

    def copies(self, cap: int = 16) -> int:
        """Replicas asked in all, each clamped to 1..cap (0 asks for one)."""
        r = self.replicas
        if not r or max(r) <= cap:
            return sum(r) + r.count(0)
        return sum(map(min, map(max, r, repeat(1)), repeat(cap)))


class Limits:
    """The checks of one master (its config and live state)."""

    def __init__(self, config: Any, state: Any) -> None:
        self.cfg = config
        self.state = state
        self.reply_cap = config.max_message_bytes - min(REPLY_MARGIN, config.max_message_bytes // 4)
        self.location_max = config.max_id_bytes + config.max_segment_name_bytes + LOCATION_OVERHEAD
        self._loc = (-1, 0)
        self._given: list[str] | None = None  # the guard's list of the request's keys
        self._items: Items | None = None
        self._checks: dict[str, Callable[[Any], None]] = {
            "RegisterNode": self._register, "Heartbeat": self._node_only,
            "MountSegment": self._mount, "UnmountSegment": self._node_segment,
            "PutStart": self._put_start, "PutEnd": self._put_end, "PutRevoke": self._client_keys,
            "GrantExtent": self._grant, "CommitExtent": self._commit,
            "BatchLookup": self._lookup, "MatchPrefix": self._match,
            "ListObjects": self._list, "NodeTasks": self._node_tasks, "Remove": self._remove,
            "AnnounceObjects": self._announce, "ReportCorrupt": self._report,
            "Evict": self._evict, "Pin": self._keys, "Unpin": self._keys,
            "Inspect": self._inspect, "Cordon": self._node_only,
            "ReportUnreachable": self._unreachable,
        }  # fmt: skip

    def location(self) -> int:
        """An upper bound of one encoded Location in this pool (its longest names)."""
        segments = self.state.registry.segments
        if self._loc[0] != len(segments):
            longest = max((len(n) + len(s) for n, s in segments), default=0)
            self._loc = (len(segments), 4 * longest + LOCATION_OVERHEAD)
        return self._loc[1]

    def check(
        self, method: str, request: Any, keys: list[str] | None = None, items: Items | None = None
    ) -> None:
        """Raise the typed error of the first limit `request` passes; `keys` is its `keys`
        field as a list and `items` its items as columns, when the caller has them (the
        guard shares them with authz and the quotas)."""
        self._given = keys
        self._items = items
        fn = self._checks.get(method)
        if fn is not None:
            fn(request)

    # ---- pieces ------------------------------------------------------------------

    def batch(self, n: int) -> None:
        if n > self.cfg.max_batch:
            raise BadRequestError(f"batch of {n} exceeds max_batch {self.cfg.max_batch}")

    def ident(self, what: str, value: str) -> None:
        check_str(what, value, self.cfg.max_id_bytes)

    def keys(self, keys: Any, hint: int, what: str = "key") -> None:
        self.batch(len(keys))
        check_strs(
            what, self._given if self._given is not None else keys, self.cfg.max_key_bytes, hint
        )

    def segment_name(self, name: str) -> None:
        check_str("segment name", name, self.cfg.max_segment_name_bytes)

    def reply(self, method: str, size: int) -> None:
        if size > self.reply_cap:
            raise TooLargeError(
                f"{method} reply would be ~{size} bytes, over the {self.cfg.max_message_bytes}"
                "-byte message cap: split the batch"
            )

    # ---- nodes -------------------------------------------------------------------

    def _node_only(self, r: Any) -> None:
        self.ident("node_id", r.node_id)

    def _node_segment(self, r: Any) -> None:
        self.ident("node_id", r.node_id)
        self.segment_name(r.segment)

    def _register(self, r: Any) -> None:
        cfg = self.cfg
        self.ident("node_id", r.node_id)
        self.ident("incarnation", r.incarnation)
        ep = r.endpoint
        for what in ("tcp_address", "rpc_address", "shm_host_id", "shm_socket"):
            check_str(what, getattr(ep, what), cfg.max_address_bytes)
        if len(ep.nixl_metadata) > cfg.max_nixl_metadata_bytes:
            raise _too_long("nixl_metadata", ep.nixl_metadata, cfg.max_nixl_metadata_bytes)
        nodes = self.state.registry.nodes
        old = nodes.get(r.node_id)
        if old is None and len(nodes) >= cfg.max_nodes:
            raise NoSpaceError(f"the master holds max_nodes {cfg.max_nodes} nodes")
        was = 0 if old is None else _node_bytes(old.node_id, old.endpoint)
        self._stats_room(_node_bytes(r.node_id, ep) - was)

    def _mount(self, r: Any) -> None:
        cfg = self.cfg
        self._node_segment(r)
        if not 0 < r.capacity <= cfg.max_segment_bytes:
            raise BadRequestError(
                f"segment capacity {r.capacity} outside 1..max_segment_bytes "
                f"{cfg.max_segment_bytes}"
            )
        if r.alignment > min(MAX_ALIGNMENT, r.capacity):
            raise BadRequestError(f"alignment {r.alignment} over {MAX_ALIGNMENT} or the capacity")
        registry = self.state.registry
        if (r.node_id, r.segment) in registry.segments:
            return  # a remount: nothing grows
        mine = sum(1 for n, _ in registry.segments if n == r.node_id)
        if mine >= cfg.max_segments_per_node:
            raise NoSpaceError(f"node {r.node_id!r} has max_segments_per_node {mine} segments")
        self._stats_room(_segment_bytes(r.node_id, r.segment))

    def _stats_room(self, grow: int) -> None:
        """Stats lists every node and segment: refuse what would push it past the cap."""
        if grow > 0 and self.stats_bytes() + grow > self.reply_cap:
            raise NoSpaceError(
                f"the pool's Stats reply would pass the {self.cfg.max_message_bytes}-byte "
                "message cap: no more nodes or segments (or smaller node metadata)"
            )

    def stats_bytes(self) -> int:
        """An upper bound of the Stats reply's size now."""
        reg = self.state.registry
        nodes = sum(_node_bytes(n.node_id, n.endpoint) for n in reg.nodes.values())
        segs = sum(_segment_bytes(n, s) for n, s in reg.segments)
        return 512 + nodes + segs

    # ---- puts and reads ----------------------------------------------------------

    def _client_keys(self, r: Any) -> None:
        self.ident("client_id", r.client_id)
        self.keys(r.keys, r.ByteSize())

    def _keys(self, r: Any) -> None:
        self.keys(r.keys, r.ByteSize())

    def _remove(self, r: Any) -> None:
        self._client_keys(r)
        self.ident("node_id", r.node_id)

    def _put_start(self, r: Any) -> None:
        cfg = self.cfg
        cols = self._items or Items.of("PutStart", r.items)
        n = len(cols.keys)
        self.batch(n)
        self.ident("client_id", r.client_id)
        self.ident("client_node", r.client_node)
        check_col("key", cols.keys, cfg.max_key_bytes)
        check_col("group", cols.groups, cfg.max_group_bytes)
        check_col("preferred_node", cols.nodes, cfg.max_id_bytes)
        # The request's size from its strings' lengths (ByteSize walks it again, ~0.6 us an
        # item); a multi-byte character is up to 4 bytes, so near the cap ask ByteSize.
        chars = sum(map(len, cols.keys)) + sum(map(len, cols.groups)) + sum(map(len, cols.nodes))
        hint = chars + ITEM_OVERHEAD * n
        if 4 * chars + ITEM_OVERHEAD * n > self.reply_cap // 2:
            hint = r.ByteSize()
        objects = len(self.state.objects)
        if objects + n > cfg.max_objects:
            raise NoSpaceError(
                f"the master holds {objects} objects of max_objects {cfg.max_objects}"
            )
        replicas = cols.copies(min(16, max(1, len(self.state.registry.nodes))))
        self.reply("PutStart", hint + n * RESULT_OVERHEAD + replicas * self.location())

    def _grant(self, r: Any) -> None:
        self.ident("client_id", r.client_id)
        self.ident("client_node", r.client_node)
        if r.size > self.cfg.max_segment_bytes or r.min_size > self.cfg.max_segment_bytes:
            raise BadRequestError(f"extent of {r.size} bytes exceeds max_segment_bytes")

    def _commit(self, r: Any) -> None:
        cfg = self.cfg
        cols = self._items or Items.of("CommitExtent", r.items)
        self.batch(len(cols.keys))
        self.ident("client_id", r.client_id)
        if r.ByteSize() > min(cfg.max_key_bytes, cfg.max_group_bytes):
            check_col("key", cols.keys, cfg.max_key_bytes)
            check_col("group", cols.groups, cfg.max_group_bytes)
        if len(self.state.objects) + len(cols.keys) > cfg.max_objects:
            raise NoSpaceError(f"committing {len(cols.keys)} objects would pass max_objects")
        if r.next_size or r.release_extents:  # the next extent it asks for, as a GrantExtent's
            self.batch(len(r.release_extents))
            self.ident("client_node", r.client_node)
            if max(r.next_size, r.next_min_size) > cfg.max_segment_bytes:
                raise BadRequestError(f"extent of {r.next_size} bytes exceeds max_segment_bytes")

    def _put_end(self, r: Any) -> None:
        self._client_keys(r)
        if len(r.checksums) > len(r.keys):
            raise BadRequestError(f"{len(r.checksums)} checksums for {len(r.keys)} keys")

    def _lookup(self, r: Any) -> None:
        keys = r.keys
        hint = r.ByteSize()
        self.keys(keys, hint)
        self.ident("client_id", r.client_id)
        if r.cached_keys:  # reads served from the client's location cache, reported
            self.batch(len(r.cached_keys))
            check_strs("cached key", r.cached_keys, self.cfg.max_key_bytes, hint)
        n = len(keys)
        replicas = min(MAX_REPLICAS, len(self.state.registry.segments)) * self.location()
        per_hit = self.cfg.max_group_bytes + replicas  # a hit carries its group and replicas
        if hint + n * (RESULT_OVERHEAD + per_hit) > self.reply_cap:
            self.reply("BatchLookup", self._lookup_bytes(self._given or keys))

    def _lookup_bytes(self, keys: Any) -> int:
        """The reply's size, key by key (only for batches whose static bound is too big)."""
        objects = self.state.objects
        total = 0
        for key in keys:
            obj = objects.get(key)
            replicas = getattr(obj, "replicas", None)
            if not replicas:
                total += RESULT_OVERHEAD + len(key) * 2
            elif getattr(obj, "wire", None) is not None:
                total += len(obj.wire) + 16  # type: ignore[union-attr, arg-type]
            else:  # a hit: its size, group, replicas and checksum
                group = len(obj.group.encode())  # type: ignore[union-attr]
                locs = sum(len(r.node_id) + len(r.segment) + LOCATION_OVERHEAD for r in replicas)
                total += 40 + group + locs
        return total

    def _match(self, r: Any) -> None:
        self.batch(len(r.keys))
        limit = max(self.cfg.max_key_bytes, self.cfg.max_group_bytes)
        check_strs("key", r.keys, limit, r.ByteSize())

    def _list(self, r: Any) -> None:
        cfg = self.cfg
        check_str("page_token", r.page_token, cfg.max_key_bytes)
        check_str("prefix", r.prefix, cfg.max_key_bytes)
        replicas = MAX_REPLICAS * self.location_max
        per_object = 160 + cfg.max_key_bytes + cfg.max_group_bytes + replicas
        fits = max(1, self.reply_cap // per_object)
        if (r.page_size or 100) > fits:
            r.page_size = min(fits, cfg.max_page_size)  # a shorter page; the token pages on

    def _unreachable(self, r: Any) -> None:
        self.ident("client_id", r.client_id)
        self.batch(len(r.node_ids))
        for node_id in r.node_ids:
            self.ident("node_id", node_id)

    def _inspect(self, r: Any) -> None:
        check_str("key", r.key, self.cfg.max_key_bytes)

    def _evict(self, r: Any) -> None:
        self.keys(r.keys, r.ByteSize())
        check_str("prefix", r.prefix, self.cfg.max_key_bytes)

    # ---- tiers -------------------------------------------------------------------

    def _node_tasks(self, r: Any) -> None:
        self.ident("node_id", r.node_id)
        self.batch(len(r.done))
        for res in r.done:
            check_enum("task status code", res.status.code, ERROR_CODES)
        if r.wait_ms > MAX_POLL_MS:
            r.wait_ms = MAX_POLL_MS  # a long poll is a poll, not a 49-day hold of a call

    def _announce(self, r: Any) -> None:
        cfg = self.cfg
        self._node_segment(r)
        objs = r.objects
        self.batch(len(objs))
        if r.ByteSize() > min(cfg.max_key_bytes, cfg.max_group_bytes):
            for o in objs:
                check_str("key", o.key, cfg.max_key_bytes)
                check_str("group", o.group, cfg.max_group_bytes)
        if len(self.state.objects) + len(objs) > cfg.max_objects:
            raise NoSpaceError(f"announcing {len(objs)} objects would pass max_objects")
        self.reply("AnnounceObjects", r.ByteSize() + 64)  # refused keys echo back at most

    def _report(self, r: Any) -> None:
        self.keys(r.keys, r.ByteSize())
        self.batch(len(r.replicas))
        for loc in r.replicas:
            self.ident("node_id", loc.node_id)
            self.segment_name(loc.segment)
            check_enum("tier", loc.tier, TIERS)


def _node_bytes(node_id: str, ep: Any) -> int:
    """An upper bound of one NodeStats' encoding."""
    strings = (ep.tcp_address, ep.shm_host_id, ep.rpc_address, ep.shm_socket)
    return 48 + len(node_id) * 4 + sum(len(s) * 4 for s in strings) + len(ep.nixl_metadata)


def _segment_bytes(node_id: str, name: str) -> int:
    """An upper bound of one SegmentStats' encoding."""
    return 200 + (len(node_id) + len(name)) * 4
