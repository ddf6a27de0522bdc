"""Run the master: a grpc.aio server with the Master and health services, plus a
background tick (node liveness, writer-death reclaim, watermark eviction).

    handle = await serve(MasterConfig(listen="127.0.0.1:0"))   # handle.address
    await handle.stop()
    run_master("127.0.0.1:50051")                                # blocking, for the CLI
    run_master("127.0.0.1:50051", ha=HAConfig(("127.0.0.1:2379",), "pool-a"))   # HA on etcd
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import uuid
from dataclasses import dataclass, replace
from typing import Any

from kvstore import busypoll, edge
from kvstore.errors import BadRequestError
from kvstore.fastlane import FastLaneServer
from kvstore.master.config import MasterConfig
from kvstore.master.coord import HAConfig
from kvstore.master.journal import MetaJournal, NullJournal, RocksJournal
from kvstore.master.metadata import MasterState
from kvstore.master.service import MasterServicer
from kvstore.security import config as security_config
from kvstore.security.guard import MasterGuard
from kvstore.v1 import master_pb2_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = "kvstore.v1.Master"


@dataclass(slots=True)
class MasterHandle:
    """A running master: its address, state and how to stop it."""

    address: str
    epoch: str
    state: MasterState
    edge: edge.EdgeServer
    ticker: asyncio.Task[None]
    journal: MetaJournal
    lane: FastLaneServer | None = None

    @property
    def metrics_address(self) -> str:
        return self.edge.metrics_address

    async def stop(self, grace_s: float = 0.5) -> None:
        self.ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.ticker
        if self.lane is not None:
            await self.lane.stop()
        await self.edge.stop(grace_s)
        self.journal.close()


grpc_options = edge.channel_options  # kept for callers of the old name


async def serve(config: MasterConfig, metrics_listen: str | None = None) -> MasterHandle:
    """Start a master on `config.listen` (port 0 picks a free one) and return its handle;
    `metrics_listen` HOST:PORT serves /metrics (None: KVSTORE_METRICS_LISTEN, if set)."""
    from kvstore.metrics import MasterCollector

    journal: MetaJournal = RocksJournal(config.db_path) if config.db_path else NullJournal()
    try:
        state = MasterState(config, journal=journal)
        restored = state.restore()
        # Clients may still read what the last process let them cache (read leases of
        # the default length, writer leases): hold the restored objects that long. A
        # longer lease a client asked for is not recorded by a single master's journal
        # (HA masters record the longest one granted: kvstore.master.ha).
        state.hold_all(max(config.default_lease_ttl_s, config.writer_lease_ttl_s))
        epoch = uuid.uuid4().hex
        servicer = MasterServicer(state, epoch)
        servicer.guard = guard = MasterGuard(state)  # limits, authz, quotas (kvstore.security)
        collector = MasterCollector.for_state(state, asyncio.get_running_loop())
        server = await edge.start_server(
            config.listen,
            lambda s: master_pb2_grpc.add_MasterServicer_to_server(servicer, s),
            [SERVICE_NAME],
            metrics_listen=metrics_listen,
            collectors=[collector],
            component="master",
            max_message_bytes=config.max_message_bytes,
            interceptors=[guard],
        )
    except BaseException:
        journal.close()
        raise
    lane = await _start_fast_lane(config, servicer, server.address)
    ticker = asyncio.create_task(_tick_forever(servicer, config.tick_interval_s))
    log.info(
        "event=master_started epoch=%s address=%s restored_objects=%d metrics=%s",
        epoch, server.address, restored, server.metrics_address or "-",
    )  # fmt: skip
    return MasterHandle(server.address, epoch, state, server, ticker, journal, lane)


async def _start_fast_lane(
    config: MasterConfig, servicer: MasterServicer, address: str
) -> FastLaneServer | None:
    """The hot-path calls on a framed TCP port beside gRPC (kvstore.fastlane); plaintext,
    so only where the gRPC port is plaintext too."""
    if not config.fast_lane or not security_config.from_env().insecure:
        return None
    lane = await FastLaneServer.start(servicer, edge.split_address(address)[0])
    servicer.fast_lane = lane.address
    servicer.fast_lane_local = lane.local
    return lane


async def _tick_forever(servicer: MasterServicer, interval_s: float) -> None:
    state = servicer.state
    while True:
        await asyncio.sleep(interval_s)
        dead, reclaimed, evicted = state.tick()
        servicer.readers.prune(state.clock())
        servicer.broker.wake()  # offloads queued by the watermark pass
        for node_id in dead:
            log.warning("event=node_dead node=%s reason=heartbeat_timeout", node_id)
        if reclaimed:
            log.info("event=objects_dropped count=%d reason=writer_timeout", reclaimed)
        if evicted:
            log.info("event=objects_dropped count=%d reason=watermark_eviction", evicted)


def run_master(
    listen: str, db_path: str | None = None, *, metrics_listen: str | None = None,
    config: MasterConfig | None = None, ha: HAConfig | None = None, **overrides: Any,
) -> None:  # fmt: skip
    """Blocking entry point (for `kvstore master`): serve until SIGINT or SIGTERM (signal
    handlers need the main thread; elsewhere, until KeyboardInterrupt), then stop cleanly.
    `config` (e.g. from a TOML file, see kvstore.config) replaces listen/db/overrides.
    `ha`: run as one master of an HA pool on etcd (kvstore.master.ha) instead."""
    if config is None:
        config = replace(MasterConfig(listen=listen, db_path=db_path), **overrides)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        if ha is not None:
            await _serve_ha(config, ha, metrics_listen, stop)
            return
        handle = await serve(config, metrics_listen)
        metrics = f" metrics {handle.metrics_address}" if handle.metrics_address else ""
        print(
            f"kvstore master listening on {handle.address} epoch {handle.epoch}{metrics}",
            flush=True,
        )
        try:
            await stop.wait()
        finally:
            await handle.stop()

    # the loop polls for the next request a while before it sleeps (kvstore.busypoll)
    window = busypoll.usable(config.busy_poll_us / 1e6)

    def polling() -> asyncio.AbstractEventLoop:
        return asyncio.SelectorEventLoop(busypoll.PollingSelector(window))

    factory = polling if window else None
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


async def _serve_ha(
    config: MasterConfig, ha: HAConfig, metrics_listen: str | None, stop: asyncio.Event
) -> None:
    """One master of an HA pool: a ready line, then one line per change of role."""
    from kvstore.master.ha import HAMaster

    def on_role(role: str, epoch: int) -> None:
        print(f"kvstore master {master.address} is now {role} epoch {epoch}", flush=True)

    if config.db_path:
        raise BadRequestError("--db and --etcd exclude each other: HA keeps metadata in etcd")
    master = HAMaster(config, ha, on_role=on_role)
    await master.start(metrics_listen)
    print(
        f"kvstore master listening on {master.address} role follower cluster {ha.cluster_id} "
        f"etcd {master.coord.endpoint}", flush=True,
    )  # fmt: skip
    try:
        await stop.wait()
    finally:
        await master.stop()
