"""The master's admin RPCs (Evict, Pin, Unpin, Inspect, Cordon): decode, call
`kvstore.master.admin`, encode. Mixed into `MasterServicer`, which owns `state`,
`readers` (an `admin.ReaderBook`) and `_check_batch`."""

from __future__ import annotations

import logging
from typing import TypeAlias

import grpc

from kvstore.edge import tier_from_pb, to_pb_location
from kvstore.master import admin, leases, wire
from kvstore.master.metadata import MasterState
from kvstore.master.model import ObjectMeta
from kvstore.rpc_errors import translate
from kvstore.v1 import master_pb2

Ctx: TypeAlias = grpc.aio.ServicerContext
log = logging.getLogger("kvstore.master")


class AdminRpcs:
    """Admin handlers; see proto/kvstore/v1/master.proto (admin section)."""

    state: MasterState
    readers: admin.ReaderBook

    def _check_batch(self, n: int) -> None:  # pragma: no cover - MasterServicer's wins
        raise NotImplementedError

    @translate
    async def Evict(
        self, request: master_pb2.EvictRequest, context: Ctx
    ) -> master_pb2.EvictResponse:
        self._check_batch(len(request.keys))
        tier = tier_from_pb(request.tier) if request.HasField("tier") else None
        spec = admin.EvictSpec(
            tuple(request.keys), request.prefix, tier, request.watermark, request.force,
            request.dry_run,
        )  # fmt: skip
        res = admin.evict(self.state, spec)
        if res.evicted and not spec.dry_run:
            log.info(
                "event=objects_dropped count=%d reason=admin_evict freed_bytes=%d skipped=%d",
                res.evicted, res.freed_bytes, res.skipped,
            )  # fmt: skip
        return master_pb2.EvictResponse(
            evicted=res.evicted, freed_bytes=res.freed_bytes, skipped=res.skipped,
            missing=res.missing, keys=res.keys,
        )  # fmt: skip

    @translate
    async def Pin(self, request: master_pb2.PinRequest, context: Ctx) -> master_pb2.PinResponse:
        self._check_batch(len(request.keys))
        results, ttl = admin.pin(self.state, request.keys, request.ttl_ms / 1000)
        reply = master_pb2.PinResponse.FromString(wire.statuses_payload(results))
        reply.ttl_ms = int(ttl * 1000)
        return reply

    @translate
    async def Unpin(
        self, request: master_pb2.UnpinRequest, context: Ctx
    ) -> master_pb2.UnpinResponse:
        self._check_batch(len(request.keys))
        results = admin.unpin(self.state, request.keys)
        return master_pb2.UnpinResponse.FromString(wire.statuses_payload(results))

    @translate
    async def Inspect(
        self, request: master_pb2.InspectRequest, context: Ctx
    ) -> master_pb2.InspectResponse:
        found = admin.inspect(self.state, request.key, self.readers)
        return master_pb2.InspectResponse(
            object=object_info(found.obj, self.state.clock()),
            age_ms=int(found.age_s * 1000),
            hits=found.obj.hits,
            writer=found.obj.writer,
            group_members=found.group_members,
            lease_holder=found.lease_holder,
        )

    @translate
    async def Cordon(
        self, request: master_pb2.CordonRequest, context: Ctx
    ) -> master_pb2.CordonResponse:
        nodes = admin.cordon(self.state, request.node_id, request.cordon)
        event = "node_cordoned" if request.cordon else "node_uncordoned"
        log.info("event=%s node=%s", event, request.node_id)
        return master_pb2.CordonResponse(cordoned=nodes)


def object_info(o: ObjectMeta, now: float) -> master_pb2.ObjectInfo:
    """An ObjectInfo; fields the core may not carry yet (checksum, slow_hits) default to 0."""
    return master_pb2.ObjectInfo(
        key=o.key, size=o.size, state=int(o.state), group=o.group,  # type: ignore[arg-type]  # proto enum: an int
        replicas=[to_pb_location(loc) for loc in o.replicas],
        lease_ms_left=leases.ms_left(o.lease_until, now),
        pin_ms_left=leases.ms_left(o.pin_until, now),
        checksum=getattr(o, "checksum", 0), slow_hits=getattr(o, "slow_hits", 0),
    )  # fmt: skip
