"""The DecodeService: Decode (pull a prefilled request's KV, stream tokens) and
Generate (prefill here, then decode: the colocated baseline).

Each stream bridges the scheduler thread to asyncio through a queue. When the
client cancels the stream (or the server stops) the job is cancelled: its KV
blocks are freed and its tail key is removed at the scheduler's next iteration.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator

from kvstore.errors import BadRequestError
from kvstore.rpc_errors import translate
from kvstore.serving import convert
from kvstore.serving.config import ServingConfig, build_engine
from kvstore.serving.jobs import DecodeJob, JobEvent
from kvstore.serving.node import (
    NodeServer,
    add_common_args,
    identity_stats,
    open_store,
    process_config,
    serve_until_signal,
    serving_config,
    start_server,
    translate_stream,
)
from kvstore.serving.request import Handoff, Request
from kvstore.serving.scheduler import DecodeScheduler
from kvstore.serving.store import BlockStore
from kvstore.v1 import serving_pb2 as pb
from kvstore.v1 import serving_pb2_grpc

SERVICE_NAME = "kvstore.v1.DecodeService"


class DecodeServicer(serving_pb2_grpc.DecodeServiceServicer):
    def __init__(
        self, config: ServingConfig, store: BlockStore | None, pool_segment: bool = False
    ) -> None:
        self.config = config
        self.pool_segment = pool_segment
        self.scheduler = DecodeScheduler(config, build_engine(config), store)

    @translate_stream
    async def Decode(
        self, request: pb.DecodeRequest, context: object
    ) -> AsyncIterator[pb.TokenChunk]:
        req = self._request(request.spec)
        handoff = convert.handoff_from_pb(request.handoff)
        async for chunk in self._stream(req, request.first_token, handoff):
            yield chunk

    @translate_stream
    async def Generate(
        self, request: pb.GenerateRequest, context: object
    ) -> AsyncIterator[pb.TokenChunk]:
        req = self._request(request.spec)
        limit = self.config.local_prefill_tokens
        if self.config.role != "colocated" and len(req.prompt) > limit:
            raise BadRequestError(
                f"prompt of {len(req.prompt)} tokens is over this decode node's local-prefill "
                f"limit of {limit}: prefill it on a prefill node"
            )
        async for chunk in self._stream(req, None, None):
            yield chunk

    def _request(self, spec: pb.GenerationSpec) -> Request:
        self.config.check_model(spec.model_id)
        return convert.request_from_spec(spec)

    async def _stream(
        self, req: Request, first_token: int | None, handoff: Handoff | None
    ) -> AsyncIterator[pb.TokenChunk]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[JobEvent] = asyncio.Queue()

        def sink(event: JobEvent) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody listens
                loop.call_soon_threadsafe(events.put_nowait, event)

        job = DecodeJob(req, sink, first_token=first_token, handoff=handoff)
        self.scheduler.submit(job)
        finished = False
        try:
            while not finished:
                event = await events.get()
                if event.error is not None:
                    finished = True
                    raise event.error
                finished = event.finish is not None
                yield convert.token_chunk(event)
        finally:
            if not finished:
                self.scheduler.cancel(job)

    @translate
    async def Stats(
        self, request: pb.ServingStatsRequest, context: object
    ) -> pb.ServingStatsResponse:
        s = self.scheduler.stats()
        out = identity_stats(self.config, self.pool_segment)
        out.free_blocks, out.total_blocks = s.free_blocks, s.total_blocks
        out.running, out.waiting, out.steps = s.running, s.waiting, s.steps
        out.requests_done, out.requests_failed = s.done, s.failed
        return out

    def queue_depths(self) -> dict[str, int]:
        """The /metrics gauges: sequences in the running batch, and those waiting."""
        s = self.scheduler.stats()
        return {"decode_batch": s.running, "decode_waiting": s.waiting}

    def close(self) -> None:
        self.scheduler.stop()

    async def aclose(self) -> None:
        self.close()


async def serve(
    config: ServingConfig, store: BlockStore | None, listen: str, pool_segment: bool = False
) -> tuple[NodeServer, DecodeServicer]:
    servicer = DecodeServicer(config, store, pool_segment)
    node = await start_server(
        listen,
        lambda s: serving_pb2_grpc.add_DecodeServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
        queue_depth=servicer.queue_depths,
    )
    return node, servicer


def main(argv: list[str] | None = None) -> int:
    """The process: bad input (a flag, a port in use, an unreachable master) is one line
    on stderr and the `kvstore` command's exit code (cli/errors.py)."""
    from cli.errors import OneLineParser, entry_point

    parser = OneLineParser(prog="python -m decode_node", description=__doc__.splitlines()[0])
    add_common_args(parser)
    add = parser.add_argument
    add("--colocated", action="store_true", help="serve Generate for any prompt (baseline)")
    add("--local-prefill-tokens", type=int, default=0, help="Generate prompts up to this long")
    add("--on-missing", default="recompute", choices=["recompute", "fail"])
    add(
        "--on-finish",
        default="free",
        choices=["free", "publish"],
        help="publish: keep a finished sequence's blocks in the pool for its next turn",
    )
    add("--max-batch", type=int, default=64)
    args = parser.parse_args(argv)
    return entry_point(f"{'colocated' if args.colocated else 'decode'} node", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    from cli.errors import check_listen, wait_reachable

    role = "colocated" if args.colocated else "decode"
    process_config(args).apply()
    config = serving_config(
        args,
        role,
        local_prefill_tokens=args.local_prefill_tokens,
        on_missing=args.on_missing,
        on_finish=args.on_finish,
        max_batch=args.max_batch,
    )
    check_listen(args.listen)
    if args.master:
        wait_reachable(args.master, args.master_wait_s)
    store = open_store(args, config.node_id)
    segment = bool(args.master and (args.segment_bytes or args.hbm_segment_bytes))
    serve_until_signal(role, lambda: serve(config, store, args.listen, segment), store)
    return 0
