"""Configuration of the master: one frozen dataclass, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.errors import BadRequestError


@dataclass(frozen=True, slots=True)
class MasterConfig:
    """Every knob of the master. Durations are seconds of the master's monotonic clock.

    `high_watermark`/`low_watermark` are fractions of each segment's capacity, per
    tier (`tier_watermarks` overrides them for a tier: ((tier, high, low), ...)):
    above high, the coldest evictable objects of the segment move to the next slower
    tier of the same node (offload) or, where there is none or it is full, leave
    the segment (eviction), until usage is at most low. An object read from a
    slower tier `promote_after` times gets a replica in its node's faster tier
    again (0 = never). Moves run on the nodes, `move_bytes_per_s` at most.
    """

    listen: str = "127.0.0.1:50051"
    node_ttl_s: float = 10.0
    heartbeat_interval_s: float = 2.0
    put_timeout_s: float = 30.0
    default_lease_ttl_s: float = 5.0
    max_lease_ttl_s: float = 60.0
    max_pin_ttl_s: float = 3600.0
    high_watermark: float = 0.95
    low_watermark: float = 0.85
    default_alignment: int = 64
    max_batch: int = 100_000
    max_page_size: int = 10_000
    tick_interval_s: float = 0.5
    max_message_bytes: int = 64 << 20
    db_path: str | None = None
    tier_watermarks: tuple[tuple[int, float, float], ...] = ()
    offload: bool = True
    promote_after: int = 2
    move_bytes_per_s: int = 1 << 30  # background tier moves, all nodes together; 0 = no cap
    max_moves_in_flight: int = 256
    persist_timeout_s: float = 10.0  # PutEnd waits this long for SSD replicas to be indexed
    rebalance_scan: int = 512  # LRU groups examined per segment per rebalance pass
    fast_lane: bool = True  # serve the hot-path calls on a framed TCP port too (kvstore.fastlane)
    extent_ttl_s: float = 30.0  # lease of a client's extent (kvstore.master.extents)
    # longest read lease a commit grants its writer (kvstore.master.writerleases); 0 = none
    writer_lease_ttl_s: float = 2.0
    max_extent_bytes: int = 256 << 20
    fence_s: float = 10.0  # a node clients report unreachable gets no new replica this long
    # `kvstore master`'s event loop polls for the next request this long after the last
    # one before it sleeps (kvstore.busypoll): a stream of one-object puts then finds the
    # master awake. Adaptive, never on one CPU; 0 = off. In-process masters (`serve`)
    # run on the caller's loop and do not poll.
    busy_poll_us: int = 1000

    # Limits on what callers may send and what the master holds (kvstore.security.limits;
    # each refusal is a typed error: INVALID_ARGUMENT for a size, RESOURCE_EXHAUSTED for a
    # count or memory bound).
    max_key_bytes: int = 1024  # a key, a page token, a prefix (UTF-8 bytes)
    max_id_bytes: int = 256  # node, client, segment-owner and incarnation ids
    max_group_bytes: int = 1024
    max_segment_name_bytes: int = 255
    max_address_bytes: int = 256  # each endpoint string (tcp, rpc, shm host id, shm socket)
    max_nixl_metadata_bytes: int = 64 << 10
    max_segment_bytes: int = 1 << 47  # one segment: within a 47-bit user address space
    max_nodes: int = 1024
    max_segments_per_node: int = 16
    max_objects: int = 10_000_000  # objects the master tracks (WRITING ones included)
    max_metadata_bytes: int = 8 << 30  # estimated metadata memory (kvstore.security.tenants)
    tenant_quota_bytes: int = 0  # bytes (size x replicas) each tenant may hold; 0 = no quota
    tenant_quotas: tuple[tuple[str, int], ...] = ()  # (tenant, bytes) overrides

    def __post_init__(self) -> None:
        positive = {
            "node_ttl_s": self.node_ttl_s,
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "put_timeout_s": self.put_timeout_s,
            "default_lease_ttl_s": self.default_lease_ttl_s,
            "max_lease_ttl_s": self.max_lease_ttl_s,
            "max_pin_ttl_s": self.max_pin_ttl_s,
            "tick_interval_s": self.tick_interval_s,
            "default_alignment": self.default_alignment,
            "max_batch": self.max_batch,
            "max_page_size": self.max_page_size,
            "max_message_bytes": self.max_message_bytes,
        }
        for name, value in positive.items():
            if value <= 0:
                raise BadRequestError(f"MasterConfig.{name} must be > 0, got {value}")
        if self.heartbeat_interval_s >= self.node_ttl_s:
            raise BadRequestError("heartbeat_interval_s must be shorter than node_ttl_s")
        if self.default_lease_ttl_s > self.max_lease_ttl_s:
            raise BadRequestError("default_lease_ttl_s exceeds max_lease_ttl_s")
        if not 0 <= self.writer_lease_ttl_s <= self.max_lease_ttl_s:
            raise BadRequestError("writer_lease_ttl_s must be within 0..max_lease_ttl_s")
        if not 0.0 < self.low_watermark <= self.high_watermark <= 1.0:
            raise BadRequestError("need 0 < low_watermark <= high_watermark <= 1")
        for entry in self.tier_watermarks:
            if len(entry) != 3 or entry[0] not in (0, 1, 2):
                raise BadRequestError(f"tier_watermarks entry {entry!r}: want (tier, high, low)")
            if not 0.0 < entry[2] <= entry[1] <= 1.0:
                raise BadRequestError(f"tier_watermarks {entry!r}: need 0 < low <= high <= 1")
        if self.promote_after < 0 or self.move_bytes_per_s < 0:
            raise BadRequestError("promote_after and move_bytes_per_s must be >= 0")
        if self.max_moves_in_flight <= 0 or self.persist_timeout_s <= 0:
            raise BadRequestError("max_moves_in_flight and persist_timeout_s must be > 0")
        if not 0 <= self.busy_poll_us <= 100_000:
            raise BadRequestError(f"busy_poll_us must be in [0, 100000], got {self.busy_poll_us}")
        if self.rebalance_scan <= 0:
            raise BadRequestError("rebalance_scan must be > 0")
        if self.default_alignment & (self.default_alignment - 1):
            raise BadRequestError("default_alignment must be a power of two")
        from kvstore.security.limits import check_config

        check_config(self)

    def watermarks(self, tier: int) -> tuple[float, float]:
        """(high, low) fractions of a segment of `tier`."""
        for t, high, low in self.tier_watermarks:
            if t == tier:
                return high, low
        return self.high_watermark, self.low_watermark
