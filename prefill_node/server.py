"""The PrefillService: validate, queue on one compute thread, prefill, answer.

Requests run one at a time on a single compute thread (the model uses every core
it is given); the time a request waits for that thread is its `queue_s`. Stats
report the node's identity (what names its pool keys) and its queue: requests and
prompt tokens waiting for the compute thread. A background task removes handed-off
tails that no decode node consumed within `tail_ttl_s`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

from kvstore.errors import BadRequestError
from kvstore.rpc_errors import translate
from kvstore.serving import convert
from kvstore.serving.config import ServingConfig, build_engine
from kvstore.serving.node import (
    NodeServer,
    add_common_args,
    identity_stats,
    open_store,
    process_config,
    serve_until_signal,
    serving_config,
    start_server,
)
from kvstore.serving.prefill import PrefillResult, PrefillWorker
from kvstore.serving.prefill_queue import PrefillQueue, Ticket
from kvstore.serving.request import Request
from kvstore.serving.store import BlockStore
from kvstore.v1 import serving_pb2 as pb
from kvstore.v1 import serving_pb2_grpc

SERVICE_NAME = "kvstore.v1.PrefillService"


class PrefillServicer(serving_pb2_grpc.PrefillServiceServicer):
    def __init__(
        self, config: ServingConfig, store: BlockStore, pool_segment: bool = False
    ) -> None:
        self.config = config
        self.pool_segment = pool_segment
        self.worker = PrefillWorker(config, build_engine(config), store)
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="prefill")
        self._done = self._failed = 0
        self.queue = PrefillQueue()
        self._sweeper: asyncio.Task[None] | None = None

    @translate
    async def Prefill(self, request: pb.PrefillRequest, context: object) -> pb.PrefillResponse:
        self.config.check_model(request.spec.model_id)
        req = convert.request_from_spec(request.spec)
        req.check_fits(self.worker.engine.config)
        arrival = time.perf_counter()
        loop = asyncio.get_running_loop()
        ticket = self.queue.add(len(req.prompt))
        try:
            queue_s, result = await loop.run_in_executor(
                self._compute, self._run, req, arrival, ticket
            )
        except Exception:
            self._failed += 1
            raise
        finally:
            self.queue.drop(ticket)  # a no-op unless it never left the queue
        self._done += 1
        return convert.prefill_response(result, req, queue_s)

    def _run(self, req: Request, arrival: float, ticket: Ticket) -> tuple[float, PrefillResult]:
        queue_s = time.perf_counter() - arrival
        self.queue.start(ticket)
        try:
            return queue_s, self.worker.prefill(req)
        finally:
            self.queue.end(ticket)

    @translate
    async def Stats(
        self, request: pb.ServingStatsRequest, context: object
    ) -> pb.ServingStatsResponse:
        pool = self.worker.kv.pool
        out = identity_stats(self.config, self.pool_segment)
        out.free_blocks, out.total_blocks = pool.free_count, pool.num_blocks
        q = self.queue.counts()
        out.running, out.waiting, out.waiting_tokens = q.running, q.waiting, q.waiting_tokens
        out.requests_done, out.requests_failed = self._done, self._failed
        return out

    def queue_depths(self) -> dict[str, int]:
        """The /metrics gauges: prefills waiting for the compute thread, and running."""
        q = self.queue.counts()
        return {"prefill_waiting": q.waiting, "prefill_running": q.running}

    def start_sweeper(self) -> None:
        """Sweep expired tails every quarter TTL (at most every 10 s), off the loop."""
        if self.worker.tails is not None:
            period = min(self.config.tail_ttl_s / 4, 10.0)
            self._sweeper = asyncio.create_task(self._sweep_forever(period))

    async def _sweep_forever(self, period_s: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period_s)
            await loop.run_in_executor(None, self.worker.sweep_tails)

    async def stop_sweeper(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper

    def close(self) -> None:
        self._compute.shutdown(wait=True)
        self.worker.close()

    async def aclose(self) -> None:
        await self.stop_sweeper()
        self.close()


async def serve(
    config: ServingConfig, store: BlockStore, listen: str, pool_segment: bool = False
) -> tuple[NodeServer, PrefillServicer]:
    servicer = PrefillServicer(config, store, pool_segment)
    servicer.start_sweeper()
    node = await start_server(
        listen,
        lambda s: serving_pb2_grpc.add_PrefillServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
        queue_depth=servicer.queue_depths,
    )
    return node, servicer


def main(argv: list[str] | None = None) -> int:
    """The process: bad input (a flag, a port in use, an unreachable master) is one line
    on stderr and the `kvstore` command's exit code (cli/errors.py)."""
    from cli.errors import OneLineParser, entry_point

    parser = OneLineParser(prog="python -m prefill_node", description=__doc__.splitlines()[0])
    add_common_args(parser)
    ttl_help = "remove a handed-off tail block not consumed within this many s (0: never)"
    parser.add_argument("--tail-ttl-s", type=float, default=600.0, help=ttl_help)
    args = parser.parse_args(argv)
    return entry_point("prefill node", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    from cli.errors import check_listen, wait_reachable

    process_config(args).apply()
    config = serving_config(args, "prefill", tail_ttl_s=args.tail_ttl_s)
    check_listen(args.listen)
    if args.master:
        wait_reachable(args.master, args.master_wait_s)
    store = open_store(args, config.node_id)
    if store is None:
        raise BadRequestError("a prefill node needs --master (or --local-store-bytes)")
    segment = bool(args.master and (args.segment_bytes or args.hbm_segment_bytes))
    serve_until_signal("prefill", lambda: serve(config, store, args.listen, segment), store)
    return 0
