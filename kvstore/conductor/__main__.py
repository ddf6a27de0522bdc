"""`python -m kvstore.conductor`: serve Generate in front of prefill and decode nodes.

    python -m kvstore.conductor --listen 127.0.0.1:0 --master 127.0.0.1:50051 \
        --prefill 127.0.0.1:7001,127.0.0.1:7003 --decode 127.0.0.1:7002 --policy cache_load

Prints one line `conductor listening on <host:port>` once it serves; runs until
SIGINT/SIGTERM. A bad flag (unknown policy or profile) exits with status 2 and a
message naming the valid values. What names the pool keys (seed, batching mode,
layers, block size, object shape) and each decode node's local-prefill limit are
read from the nodes' Stats; --seed, --batched/--no-batched, --kv-objects and
--local-prefill-tokens override them (a node that differs from a stated value is
refused and logged).

A vLLM fleet (routed by the KV events each engine publishes; see docs/engines.md):

    python -m kvstore.conductor --listen 127.0.0.1:7000 \
        --vllm http://127.0.0.1:8001,http://127.0.0.1:8002 \
        --kv-events tcp://127.0.0.1:5557,tcp://127.0.0.1:5567 --vllm-block-size 16

--config FILE reads the [conductor] section of a TOML file (lists for vllm and
kv_events); flags given on the command line override it. Bad input (an unknown
policy, a port in use, a malformed engine URL) ends in one line on stderr and the
`kvstore` command's exit codes (2 usage, 4 unavailable), no traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import signal
import sys
from collections.abc import Sequence
from typing import Any

from kvstore.conductor.profiles import DEFAULT_PROFILE
from kvstore.conductor.service_config import ConductorConfig


def _addresses(text: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in text.split(",") if a.strip())


def build_parser() -> argparse.ArgumentParser:
    from cli.errors import OneLineParser

    p = OneLineParser(prog="python -m kvstore.conductor", description=__doc__)
    add = p.add_argument
    add("--listen", default="127.0.0.1:0", help="host:port (port 0 picks a free one)")
    add("--master", default="", help="master host:port (prefix matches); none: load only")
    add("--prefill", default="", help="prefill nodes, host:port,...")
    add("--decode", default="", help="decode nodes, host:port,...")
    add("--colocated", default="", help="colocated nodes (decode_node --colocated), host:port,...")
    add("--policy", default="cache_load", help="default placement policy")
    add("--profile", default=DEFAULT_PROFILE, help="latency profile the policies predict with")
    add("--tbt-budget-s", type=float, default=0.1, help="TBT budget without a request SLO")
    told = "; default: what the nodes report"
    add("--seed", type=int, default=None, help="require this weight seed" + told)
    batched_help = "require nodes run with (or without) --batched" + told
    add("--batched", action=argparse.BooleanOptionalAction, default=None, help=batched_help)
    objects_help = "require this KV object shape" + told
    add("--kv-objects", choices=["layer", "block"], default=None, help=objects_help)
    local_help = "lower the decode nodes' local-prefill limit to this" + told
    add("--local-prefill-tokens", type=int, default=None, help=local_help)
    add("--refresh-s", type=float, default=1.0, help="how often to refresh node Stats")
    add("--timeout-s", type=float, default=60.0, help="deadline of each node call")
    add("--vllm", default="", help="vLLM OpenAI servers, [NAME=]http://HOST:PORT,...")
    add("--kv-events", default="", help="each vLLM engine's KV-event PUB endpoint, same order")
    add("--kv-events-replay", default="", help="each engine's ROUTER replay endpoint, same order")
    add("--kv-events-topic", default="", help="KV-event topic the engines publish on")
    add("--vllm-model", default="", help='the model id of the vLLM fleet ("": any request)')
    add("--vllm-block-size", type=int, default=16, help="the engines' --block-size")
    add("--vllm-hash", default="sha256", help="the engines' --prefix-caching-hash-algo")
    add("--vllm-hash-seed", default=None, help="the engines' PYTHONHASHSEED (default: unset)")
    add("--master-wait-s", type=float, default=10.0, help="wait at start for the master")
    add("--config", default=None, help="TOML file; its [conductor] section, under the flags")
    return p


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """ConductorConfig fields from the flags (all of them, defaults included)."""
    return dict(
        listen=args.listen,
        master=args.master,
        prefill=_addresses(args.prefill),
        decode=_addresses(args.decode),
        colocated=_addresses(args.colocated),
        policy=args.policy,
        profile=args.profile,
        tbt_budget_s=args.tbt_budget_s,
        seed=args.seed,
        batch_invariant=None if args.batched is None else not args.batched,
        kv_objects=args.kv_objects,
        local_prefill_tokens=args.local_prefill_tokens,
        refresh_s=args.refresh_s,
        rpc_timeout_s=args.timeout_s,
        vllm=_addresses(args.vllm),
        kv_events=_addresses(args.kv_events),
        kv_events_replay=_addresses(args.kv_events_replay),
        kv_events_topic=args.kv_events_topic,
        vllm_model=args.vllm_model,
        vllm_block_size=args.vllm_block_size,
        vllm_hash=args.vllm_hash,
        vllm_hash_seed=args.vllm_hash_seed,
    )


def config_from_args(
    args: argparse.Namespace, parser: argparse.ArgumentParser | None = None
) -> ConductorConfig:
    """The flags' configuration; with --config, the file's [conductor] section overridden
    by the flags that differ from their defaults."""
    values = flag_values(args)
    if not getattr(args, "config", None):
        return ConductorConfig(**values)
    from kvstore.config import load

    parser = parser or build_parser()
    defaults = flag_values(parser.parse_args([]))
    given = {k: v for k, v in values.items() if v != defaults[k]}
    return load(args.config).section("conductor", given).build()  # type: ignore[no-any-return]


async def _serve(config: ConductorConfig) -> None:
    from kvstore.conductor.server import start

    running = await start(config)
    # Start-up leaves ~180,000 long-lived objects (torch, the tokenizer, grpc): frozen,
    # the collector stops walking them, so a full collection (what frees a cycle some
    # of whose objects were promoted while a request was in flight) runs within
    # seconds instead of after ~45,000 new survivors, and the garbage waiting for it,
    # the allocator's high water, stays small.
    gc.collect()
    gc.freeze()
    print(f"conductor listening on {running.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await running.stop()


def main(argv: Sequence[str] | None = None) -> int:
    from cli.errors import entry_point, quiet_grpc

    quiet_grpc()  # before grpc loads (the server module imports it)
    parser = build_parser()
    args = parser.parse_args(argv)
    return entry_point("kvstore conductor", lambda: _main(args, parser))


def _main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from cli.errors import check_listen, wait_reachable

    config = config_from_args(args, parser)
    check_listen(config.listen)
    if config.master:
        wait_reachable(config.master, args.master_wait_s)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
