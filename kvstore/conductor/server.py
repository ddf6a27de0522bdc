"""Starting the conductor: its gRPC server, the channel to the master, the node
directory (`nodes.py`) and its background refresh.

    python -m kvstore.conductor --listen 127.0.0.1:0 --master 127.0.0.1:50051 \
        --prefill 127.0.0.1:7001 --decode 127.0.0.1:7002 --policy cache_load

The servicer itself (placement and token relay) is in `service.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import grpc

from kvstore import edge, failover
from kvstore.conductor.fleet import EngineFleet
from kvstore.conductor.nodes import NodeDirectory
from kvstore.conductor.service import ConductorServicer
from kvstore.conductor.service_config import ConductorConfig
from kvstore.metrics import ConductorCollector
from kvstore.v1 import conductor_pb2_grpc, master_pb2_grpc

SERVICE_NAME = "kvstore.v1.Conductor"


@dataclass(slots=True)
class ConductorServer:
    """A started conductor: its gRPC server, address and background refresh."""

    server: grpc.aio.Server
    address: str
    directory: NodeDirectory
    master_channel: grpc.aio.Channel | None
    refresher: asyncio.Task[None]
    fleet: EngineFleet | None = None

    async def stop(self, grace_s: float = 0.5) -> None:
        self.refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.refresher
        await self.server.stop(grace_s)
        await self.directory.close()
        if self.fleet is not None:
            self.fleet.close()
        if self.master_channel is not None:
            await self.master_channel.close()


async def start(config: ConductorConfig) -> ConductorServer:
    """Contact the nodes once, then serve Conductor (and health) on `config.listen`."""
    directory = NodeDirectory(config)
    await directory.refresh()
    master_channel = None
    master = None
    if config.master:
        master_channel = failover.aio_failover_channel(config.master)  # one or an HA list
        master = master_pb2_grpc.MasterStub(master_channel)
    fleet = config.fleet().start() if config.vllm else None  # KV-event ingesters
    servicer = ConductorServicer(config, directory, master, fleet)
    servicer.warm_up()
    if servicer.fleet_runner is not None:
        await servicer.fleet_runner.refresh_health()
    # kvstore.edge: health, reflection, RPC latency + TTFT/TBT histograms, and /metrics
    # when KVSTORE_METRICS_LISTEN is set (with the queue gauges and the KV-event counts)
    try:
        started = await edge.start_server(
            config.listen,
            lambda s: conductor_pb2_grpc.add_ConductorServicer_to_server(servicer, s),
            [SERVICE_NAME],
            component="conductor",
            collectors=[ConductorCollector(servicer.queue_depths, servicer.event_counts)],
        )
    except BaseException:
        await directory.close()
        if fleet is not None:
            fleet.close()
        raise
    refresher = asyncio.create_task(_refresh_forever(servicer, config.refresh_s))
    return ConductorServer(
        started.server, started.address, directory, master_channel, refresher, fleet
    )


async def _refresh_forever(servicer: ConductorServicer, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        await servicer.directory.refresh()
        if servicer.fleet_runner is not None:
            await servicer.fleet_runner.refresh_health()
