"""Run the master: a grpc.aio server with the Master and health services, plus a
background tick (node liveness, writer-death reclaim, watermark eviction).

    handle = await serve(MasterConfig(listen="127.0.0.1:0"))   # handle.address
    await handle.stop()
    run_master("127.0.0.1:50051")                                # blocking, for the CLI
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import uuid
from dataclasses import dataclass, replace

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvstore.errors import BadRequestError
from kvstore.master.config import MasterConfig
from kvstore.master.journal import MetaJournal, NullJournal, RocksJournal
from kvstore.master.metadata import MasterState
from kvstore.master.service import MasterServicer
from kvstore.v1 import master_pb2_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = "kvstore.v1.Master"


@dataclass(slots=True)
class MasterHandle:
    """A running master: its address, state and how to stop it."""

    address: str
    epoch: str
    state: MasterState
    server: grpc.aio.Server
    ticker: asyncio.Task[None]
    journal: MetaJournal

    async def stop(self, grace_s: float = 0.5) -> None:
        self.ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.ticker
        await self.server.stop(grace_s)
        self.journal.close()


def grpc_options(max_message_bytes: int = 64 << 20) -> list[tuple[str, int]]:
    """Channel/server options for master traffic: big batches, no port sharing."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]


async def serve(config: MasterConfig) -> MasterHandle:
    """Start a master on `config.listen` (port 0 picks a free one) and return its handle."""
    journal: MetaJournal = RocksJournal(config.db_path) if config.db_path else NullJournal()
    state = MasterState(config, journal=journal)
    restored = state.restore()
    epoch = uuid.uuid4().hex
    server = grpc.aio.server(options=grpc_options(config.max_message_bytes))
    master_pb2_grpc.add_MasterServicer_to_server(MasterServicer(state, epoch), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(config.listen)
    if port == 0:
        raise BadRequestError(f"cannot listen on {config.listen!r}")
    await server.start()
    serving = health_pb2.HealthCheckResponse.SERVING
    await health_servicer.set(SERVICE_NAME, serving)
    await health_servicer.set("", serving)
    host = config.listen.rsplit(":", 1)[0]
    ticker = asyncio.create_task(_tick_forever(state, config.tick_interval_s))
    log.info("master %s on %s:%d (restored %d objects)", epoch, host, port, restored)
    return MasterHandle(f"{host}:{port}", epoch, state, server, ticker, journal)


async def _tick_forever(state: MasterState, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        dead, reclaimed, evicted = state.tick()
        if dead or reclaimed or evicted:
            log.info("tick: dead nodes %s, reclaimed %d puts, evicted %d", dead, reclaimed, evicted)


def run_master(listen: str, db_path: str | None = None, **overrides: float) -> None:
    """Blocking entry point (for `kvstore master`): serve until SIGINT or SIGTERM (signal
    handlers need the main thread; elsewhere, until KeyboardInterrupt), then stop cleanly."""
    config = replace(MasterConfig(listen=listen, db_path=db_path), **overrides)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        handle = await serve(config)
        print(f"kvstore master listening on {handle.address} epoch {handle.epoch}", flush=True)
        try:
            await stop.wait()
        finally:
            await handle.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
