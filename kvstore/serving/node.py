"""What prefill and decode node processes share: command line, store, gRPC server.

    python -m prefill_node --master 127.0.0.1:50051 --listen 127.0.0.1:0 --model tiny
    python -m decode_node  --master 127.0.0.1:50051 --listen 127.0.0.1:0 --model tiny
    python -m decode_node  --colocated --listen 127.0.0.1:0 --model tiny

A node prints one line `<role> node listening on <host:port>` once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import grpc

from kvstore.errors import KVStoreError
from kvstore.rpc_errors import status_for
from kvstore.serving.config import MODELS, ProcessConfig, ServingConfig, parse_cpus
from kvstore.serving.store import BlockStore, LocalBlockStore, PoolBlockStore
from kvstore.v1 import serving_pb2 as pb

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.so_reuseport", 0),
]


def add_common_args(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--listen", default="127.0.0.1:0", help="host:port (port 0 picks a free one)")
    add("--model", default="tiny", choices=sorted(MODELS), help="model id")
    add("--seed", type=int, default=0, help="weight seed (all nodes must agree)")
    add("--master", default="", help="master host:port of the KV pool")
    wait_help = "how long to wait at start for the master to accept connections"
    add("--master-wait-s", type=float, default=10.0, help=wait_help)
    add("--transport", default="auto", help="pool data plane: auto | shm | tcp | nixl")
    seg_help = (
        "DRAM segment this node contributes to the pool under its node id: the blocks it "
        "publishes land there first, and prefix matches name it"
    )
    add("--segment-bytes", type=int, default=0, help=seg_help)
    hbm_help = "device memory (HBM) this node lends to the pool too, on its --device"
    add("--hbm-segment-bytes", type=int, default=0, help=hbm_help)
    add("--local-store-bytes", type=int, default=0, help="in-process DRAM store (no master)")
    add("--num-blocks", type=int, default=512, help="KV blocks of the node's pool")
    add("--block-tokens", type=int, default=16)
    add("--chunk-tokens", type=int, default=512, help="prefill chunk size")
    add("--batched", action="store_true", help="batched projections (not bit-exact)")
    kv_help = "store objects per (block, layer) or per block"
    add("--kv-objects", default="layer", choices=["layer", "block"], help=kv_help)
    add("--device", default="auto")
    add("--node-id", default="")
    add("--cpus", default="", help="pin the process to these cores, e.g. 0,2-3")
    add("--torch-threads", type=int, default=0, help="torch intra-op threads (0: default)")


def serving_config(args: argparse.Namespace, role: str, **extra: Any) -> ServingConfig:
    return ServingConfig(
        model_id=args.model,
        role=role,
        seed=args.seed,
        block_tokens=args.block_tokens,
        num_blocks=args.num_blocks,
        chunk_tokens=args.chunk_tokens,
        batch_invariant=not args.batched,
        kv_objects=args.kv_objects,
        device=args.device,
        node_id=args.node_id or f"{role}-{uuid.uuid4().hex[:8]}",
        **extra,
    )


def process_config(args: argparse.Namespace) -> ProcessConfig:
    return ProcessConfig(cpus=parse_cpus(args.cpus), torch_threads=args.torch_threads)


def open_store(args: argparse.Namespace, node_id: str) -> BlockStore | None:
    """The pool client when --master is given, else a local store, else None.

    The pool client's id is the serving node's id, so a contributed segment
    (--segment-bytes) is the pool node `node_id`: its puts prefer it, and the master's
    prefix matches name the serving node that holds a block."""
    if args.master:
        return PoolBlockStore.connect(
            args.master,
            transport=args.transport,
            segment_bytes=args.segment_bytes,
            hbm_segment_bytes=args.hbm_segment_bytes,
            hbm_device=_hbm_device(args.device),
            client_id=node_id,
        )
    if args.local_store_bytes:
        from kvstore.tiers.base import ObjectTier
        from kvstore.tiers.dram import DramConfig, DramTier
        from kvstore.tiers.tiered import TieredStore

        tier = DramTier(DramConfig(capacity_bytes=args.local_store_bytes))
        # DramTier takes its own handle type where ObjectTier says any WriteHandle
        return LocalBlockStore(TieredStore([cast(ObjectTier, tier)]))
    return None


def _hbm_device(device: str) -> str:
    """The torch device of a lent HBM segment: the node's own (auto = cuda if present)."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def identity_stats(config: ServingConfig, pool_segment: bool) -> pb.ServingStatsResponse:
    """The Stats fields that name the node and its pool keys (see serving.proto)."""
    return pb.ServingStatsResponse(
        node_id=config.node_id,
        role=config.role,
        model_id=config.model_id,
        block_tokens=config.block_tokens,
        seed=config.seed,
        batch_invariant=config.batch_invariant,
        num_layers=config.model.layers,
        kv_objects=config.kv_objects,
        kv_dtype=config.model.dtype,
        local_prefill_tokens=config.local_prefill_tokens,
        pool_segment=pool_segment,
    )


@dataclass(slots=True)
class NodeServer:
    """A started gRPC server and its address (and /metrics, see kvstore.edge)."""

    server: grpc.aio.Server
    address: str
    edge: Any = None


async def start_server(
    listen: str,
    add_servicers: Callable[[grpc.aio.Server], None],
    service_names: list[str],
    queue_depth: Callable[[], dict[str, int]] | None = None,
) -> NodeServer:
    """Serve through kvstore.edge: health, reflection, RPC latency and TTFT/TBT histograms,
    and `queue_depth`'s gauges, on /metrics when KVSTORE_METRICS_LISTEN is set."""
    from kvstore import edge
    from kvstore.metrics import QueueCollector

    collectors = [QueueCollector(queue_depth)] if queue_depth is not None else []
    started = await edge.start_server(listen, add_servicers, service_names, collectors=collectors)
    return NodeServer(started.server, started.address, started)


def run_node(main: Callable[[], Any]) -> None:
    """Run an async main until interrupted."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


class Servicer(Protocol):
    """What a node process closes after its server stops."""

    async def aclose(self) -> None: ...


def serve_until_signal(
    label: str,
    start: Callable[[], Awaitable[tuple[NodeServer, Servicer]]],
    store: BlockStore | None,
) -> None:
    """The life of a node process: start serving, announce "<label> node listening on
    <address>", wait for SIGINT/SIGTERM, then stop the server, the servicer and the store
    in that order (no request can reach a closed servicer or store)."""

    async def main() -> None:
        node, servicer = await start()
        stop = stop_on_signal()
        print(f"{label} node listening on {node.address}", flush=True)
        try:
            await stop.wait()
        finally:
            await node.server.stop(0.5)
            await servicer.aclose()
            if store is not None:
                store.close()

    run_node(main)


def stop_on_signal() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM, so the node shuts down cleanly (frees, unmounts).
    Install it before announcing the address: a signal right after must not kill."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def translate_stream(method: Callable[..., AsyncIterator[Any]]) -> Callable[..., Any]:
    """Decorate a server-streaming aio method: a KVStoreError aborts with its status."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            async for item in method(self, request, context):
                yield item
        except KVStoreError as exc:
            await context.abort(status_for(exc), str(exc))

    return wrapper
