"""Read leases and soft pins: deadlines on the master clock that block eviction.

A lease is granted on every lookup hit so that a reader's one-sided READ never
races with eviction reusing the bytes; a pin is a longer, caller-chosen hold
(e.g. a prefix a scheduler is about to route to). Both only ever extend.
"""

from __future__ import annotations

from kvstore.errors import BadRequestError
from kvstore.master.config import MasterConfig
from kvstore.master.model import ObjectMeta


def lease_ttl(config: MasterConfig, requested_s: float) -> float:
    """The lease actually granted: the default when 0, capped at the maximum."""
    if requested_s < 0:
        raise BadRequestError("lease ttl must be >= 0")
    if requested_s == 0:
        return config.default_lease_ttl_s
    return min(requested_s, config.max_lease_ttl_s)


def pin_ttl(config: MasterConfig, requested_s: float) -> float:
    """The pin actually granted (0 = none), capped at the maximum."""
    if requested_s < 0:
        raise BadRequestError("pin ttl must be >= 0")
    return min(requested_s, config.max_pin_ttl_s)


def extend_lease(obj: ObjectMeta, now: float, ttl_s: float) -> None:
    obj.lease_until = max(obj.lease_until, now + ttl_s)


def extend_pin(obj: ObjectMeta, now: float, ttl_s: float) -> None:
    if ttl_s > 0:
        obj.pin_until = max(obj.pin_until, now + ttl_s)


def ms_left(deadline: float, now: float) -> int:
    """Milliseconds until `deadline`, 0 when past."""
    return max(0, int((deadline - now) * 1000))
