"""What every client operation needs: config, segment directory, data path, own node."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvstore.client.config import ClientConfig
from kvstore.client.datapath import DataPath
from kvstore.client.directory import SegmentDirectory
from kvstore.client.extents import ExtentHolder
from kvstore.client.locations import LocationCache
from kvstore.client.steps import Op, Rpc
from kvstore.transfer.base import SegmentDescriptor
from kvstore.types import Location
from kvstore.v1 import master_pb2


@dataclass(slots=True)
class OpContext:
    """Shared by the operations of one client (sync or async)."""

    config: ClientConfig
    directory: SegmentDirectory
    data: DataPath
    node_id: str = ""  # the node id of our contributed segment, "" if none
    locations: LocationCache = field(init=False)  # needs checksums: they validate its reads
    extents: ExtentHolder = field(init=False)
    ssd_reads: int = 0  # reads this client served from an SSD replica (Mooncake's facade)
    writer_leased: bool = False  # a commit granted it writer leases (ended at close)

    def __post_init__(self) -> None:
        cfg = self.config
        entries = cfg.location_cache_entries if cfg.checksums else 0
        self.locations = LocationCache(entries, cfg.location_cache_ttl_s)
        self.extents = ExtentHolder(cfg.extent_bytes, cfg.extent_max_object, cfg.timeout_s)


def resolve(
    ctx: OpContext, locs: Sequence[Location], refresh: bool = False
) -> Op[list[SegmentDescriptor | None]]:
    """Descriptors of `locs`; one Stats refresh when any is unknown (or `refresh`)."""
    descs = [ctx.directory.descriptor(loc) for loc in locs]
    if refresh or any(d is None for d in descs):
        ctx.directory.update((yield Rpc("Stats", master_pb2.StatsRequest())))
        descs = [ctx.directory.descriptor(loc) for loc in locs]
    return descs


def moved(ctx: OpContext, locs: Sequence[Location]) -> Op[list[bool]]:
    """After a failed transfer: refresh the directory once; for each location, whether its
    segment now has another descriptor (its node came back on a new endpoint). A node
    that is just unreachable keeps its descriptor: retrying it would only time out again."""
    before = [ctx.directory.descriptor(loc) for loc in locs]
    after = yield from resolve(ctx, locs, refresh=True)
    return [new is not None and new != old for old, new in zip(before, after, strict=True)]


def call(method: str, request: object) -> Op[Any]:
    """An operation of one master call."""
    return (yield Rpc(method, request))
