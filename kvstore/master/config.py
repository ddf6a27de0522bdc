"""Configuration of the master: one frozen dataclass, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.errors import BadRequestError


@dataclass(frozen=True, slots=True)
class MasterConfig:
    """Every knob of the master. Durations are seconds of the master's monotonic clock.

    `high_watermark`/`low_watermark` are fractions of the pool's mounted capacity:
    above high, eviction runs until usage is at most low.
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
        if not 0.0 < self.low_watermark <= self.high_watermark <= 1.0:
            raise BadRequestError("need 0 < low_watermark <= high_watermark <= 1")
        if self.default_alignment & (self.default_alignment - 1):
            raise BadRequestError("default_alignment must be a power of two")
