"""The PrefillService: validate, queue on one compute thread, prefill, answer.

Requests run one at a time on a single compute thread (the model uses every core
it is given); the time a request waits for that thread is its `queue_s`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from kvstore.errors import KVStoreError
from kvstore.rpc_errors import translate
from kvstore.serving import convert
from kvstore.serving.config import ServingConfig, build_engine
from kvstore.serving.node import (
    NodeServer,
    add_common_args,
    open_store,
    process_config,
    run_node,
    serving_config,
    start_server,
    stop_on_signal,
)
from kvstore.serving.prefill import PrefillResult, PrefillWorker
from kvstore.serving.request import Request
from kvstore.serving.store import BlockStore
from kvstore.v1 import serving_pb2 as pb
from kvstore.v1 import serving_pb2_grpc

SERVICE_NAME = "kvstore.v1.PrefillService"


class PrefillServicer(serving_pb2_grpc.PrefillServiceServicer):
    def __init__(self, config: ServingConfig, store: BlockStore) -> None:
        self.config = config
        self.worker = PrefillWorker(config, build_engine(config), store)
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="prefill")
        self._done = self._failed = 0

    @translate
    async def Prefill(self, request: pb.PrefillRequest, context: object) -> pb.PrefillResponse:
        self.config.check_model(request.spec.model_id)
        req = convert.request_from_spec(request.spec)
        req.check_fits(self.worker.engine.config)
        arrival = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            queue_s, result = await loop.run_in_executor(self._compute, self._run, req, arrival)
        except Exception:
            self._failed += 1
            raise
        self._done += 1
        return convert.prefill_response(result, req, queue_s)

    def _run(self, req: Request, arrival: float) -> tuple[float, PrefillResult]:
        queue_s = time.perf_counter() - arrival
        return queue_s, self.worker.prefill(req)

    @translate
    async def Stats(
        self, request: pb.ServingStatsRequest, context: object
    ) -> pb.ServingStatsResponse:
        pool = self.worker.kv.pool
        return pb.ServingStatsResponse(
            node_id=self.config.node_id,
            role="prefill",
            model_id=self.config.model_id,
            free_blocks=pool.free_count,
            total_blocks=pool.num_blocks,
            requests_done=self._done,
            requests_failed=self._failed,
            block_tokens=self.config.block_tokens,
        )

    def close(self) -> None:
        self._compute.shutdown(wait=True)
        self.worker.close()


async def serve(
    config: ServingConfig, store: BlockStore, listen: str
) -> tuple[NodeServer, PrefillServicer]:
    servicer = PrefillServicer(config, store)
    node = await start_server(
        listen,
        lambda s: serving_pb2_grpc.add_PrefillServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
    )
    return node, servicer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="prefill_node", description=__doc__.splitlines()[0])
    add_common_args(parser)
    args = parser.parse_args(argv)
    try:
        process_config(args).apply()
        config = serving_config(args, "prefill")
        store = open_store(args)
    except (KVStoreError, OSError, ValueError) as exc:
        parser.error(str(exc))
    if store is None:
        parser.error("a prefill node needs --master (or --local-store-bytes)")

    async def run() -> None:
        node, servicer = await serve(config, store, args.listen)
        stop = stop_on_signal()
        print(f"prefill node listening on {node.address}", flush=True)
        try:
            await stop.wait()
        finally:
            await node.server.stop(0.5)
            servicer.close()
            store.close()

    run_node(run)
