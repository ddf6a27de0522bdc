"""Hot-prefix replication: copy the hottest prefixes off overloaded nodes.

A node is overloaded when its load exceeds `overload_factor` x the mean. Its
prefixes, hottest first, are copied to the least-loaded node under the mean
that does not hold them yet; a replica is assumed to take half of the prefix's
hits (and that share of the load) off the source. cache_load then routes
matching requests to whichever holder predicts the lower TTFT.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvstore.conductor.api import BlockId
from kvstore.errors import BadRequestError


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    """When a node counts as overloaded and how much to copy per round."""

    overload_factor: float = 1.25
    min_hits: int = 2  # a prefix hit fewer times is not worth a copy
    max_per_round: int = 4

    def __post_init__(self) -> None:
        if self.overload_factor < 1 or self.min_hits < 1 or self.max_per_round < 1:
            raise BadRequestError(f"bad replication config {self}")


@dataclass(frozen=True, slots=True)
class Replication:
    """Copy the prefix ending in block `prefix` from `from_node` to `to_node`."""

    prefix: BlockId
    from_node: str
    to_node: str


def recommend_replications(
    load: Mapping[str, float],
    hits: Mapping[BlockId, Mapping[str, int]],
    config: ReplicationConfig | None = None,
) -> list[Replication]:
    """Replications that bring overloaded nodes toward the mean, hottest prefixes first.

    `load`: node -> load (any unit, e.g. busy seconds per second). `hits`: prefix
    -> {holder node: hits served there}; every holder appears, with 0 if unhit.
    """
    cfg = config if config is not None else ReplicationConfig()
    if not load:
        raise BadRequestError("empty cluster: no node loads given")
    mean = sum(load.values()) / len(load)
    projected = dict(load)
    out: list[Replication] = []
    for src in sorted(load, key=lambda n: (-load[n], n)):
        if load[src] <= cfg.overload_factor * mean or mean <= 0:
            break
        out += _offload(src, hits, projected, mean, cfg, cfg.max_per_round - len(out))
    return out


def _offload(
    src: str,
    hits: Mapping[BlockId, Mapping[str, int]],
    projected: dict[str, float],
    mean: float,
    cfg: ReplicationConfig,
    budget: int,
) -> list[Replication]:
    """Copies of `src`'s hottest prefixes until it is under the limit; updates `projected`."""
    mine = [(h[src], p) for p, h in hits.items() if h.get(src, 0) >= cfg.min_hits]
    total = sum(h.get(src, 0) for h in hits.values())
    per_hit = projected[src] / total if total else 0.0
    out: list[Replication] = []
    for count, prefix in sorted(mine, key=lambda x: (-x[0], str(x[1]))):
        if len(out) >= budget or projected[src] <= cfg.overload_factor * mean:
            break
        free = [n for n in projected if n not in hits[prefix] and projected[n] < mean]
        if not free:
            continue
        dst = min(free, key=lambda n: (projected[n], n))
        moved = per_hit * count / 2
        projected[src] -= moved
        projected[dst] += moved
        out.append(Replication(prefix, src, dst))
    return out
