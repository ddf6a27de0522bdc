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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

from kvstore.conductor.profiles import DEFAULT_PROFILE
from kvstore.conductor.service_config import ConductorConfig
from kvstore.errors import KVStoreError


def _addresses(text: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in text.split(",") if a.strip())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvstore.conductor", description=__doc__)
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
    return p


def config_from_args(args: argparse.Namespace) -> ConductorConfig:
    return ConductorConfig(
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
    )


async def _serve(config: ConductorConfig) -> None:
    from kvstore.conductor.server import start

    running = await start(config)
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
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except KVStoreError as exc:
        parser.error(str(exc))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
