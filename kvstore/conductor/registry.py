"""Policies by name: `make_policy("cache_load", latency=..., transfer=...)`."""

from __future__ import annotations

from typing import Any

from kvstore.conductor.base import PolicyBase
from kvstore.conductor.baselines import (
    LeastLoadedPolicy,
    PrefixOnlyPolicy,
    RandomPolicy,
    RoundRobinPolicy,
)
from kvstore.conductor.cache_load import CacheLoadPolicy, ConditionalPolicy
from kvstore.conductor.flexible import FlexiblePolicy
from kvstore.errors import BadRequestError

POLICIES: dict[str, type[PolicyBase]] = {
    cls.name: cls
    for cls in (
        RoundRobinPolicy,
        RandomPolicy,
        LeastLoadedPolicy,
        PrefixOnlyPolicy,
        CacheLoadPolicy,
        ConditionalPolicy,
        FlexiblePolicy,
    )
}


def make_policy(name: str, **kwargs: Any) -> PolicyBase:
    """A new policy instance; BadRequestError naming the valid policies on an unknown name."""
    cls = POLICIES.get(name)
    if cls is None:
        raise BadRequestError(f"unknown policy {name!r}; valid: {', '.join(sorted(POLICIES))}")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise BadRequestError(f"bad arguments for policy {name!r}: {exc}") from None
