"""`kvstore demo`: a local disaggregated cluster serving multi-turn chats.

Starts, on 127.0.0.1 free ports and embedded defaults (no external service), a
master, a storage node lending DRAM (and SSD) to the pool, a prefill node and a
decode node; drives a few conversations that share a system prompt and grow turn
by turn (each prompt = system prompt + history + new message); the prefill node
publishes each prompt's KV and the decode node each reply's, so every turn's
prefix is already in the pool; prints TTFT / TBT, the prefix hit ratio (overall
and per pool tier) and the bytes moved; stops everything and checks that no
process and no shared-memory segment is left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from kvstore import edge
from kvstore.errors import BadRequestError
from kvstore.serving_bench.metrics import RequestRecord, summarize
from kvstore.serving_bench.workload import ChatSpec, Conversation, conversations

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class ClusterDemoConfig:
    model: str = "tiny"
    chat: ChatSpec = field(default_factory=lambda: ChatSpec(turns=6, reply_tokens=24))
    dram_mib: float = 2.0  # small on purpose: older blocks spill to the SSD segment
    ssd_mib: float = 64.0  # 0: DRAM only

    def __post_init__(self) -> None:
        if self.dram_mib <= 0 or self.ssd_mib < 0:
            raise BadRequestError("dram_mib must be > 0 and ssd_mib >= 0")


def register(sub: argparse._SubParsersAction) -> None:
    d = ClusterDemoConfig()
    p = sub.add_parser("demo", help="serve multi-turn chats on a local disaggregated cluster")
    add_arguments(p, d)
    p.set_defaults(handler=run)


def add_arguments(p: argparse.ArgumentParser, d: ClusterDemoConfig = ClusterDemoConfig()) -> None:
    p.add_argument("--conversations", type=int, default=d.chat.conversations)
    p.add_argument("--turns", type=int, default=d.chat.turns)
    p.add_argument("--system-tokens", type=int, default=d.chat.system_tokens)
    p.add_argument("--user-tokens", type=int, default=d.chat.user_tokens)
    p.add_argument("--reply-tokens", type=int, default=d.chat.reply_tokens)
    p.add_argument("--model", default=d.model, choices=["tiny", "small"])
    p.add_argument("--dram-mib", type=float, default=d.dram_mib)
    p.add_argument("--ssd-mib", type=float, default=d.ssd_mib)
    p.add_argument("--seed", type=int, default=0)


def config_from_args(args: argparse.Namespace) -> ClusterDemoConfig:
    chat = ChatSpec(
        conversations=args.conversations,
        turns=args.turns,
        system_tokens=args.system_tokens,
        user_tokens=args.user_tokens,
        reply_tokens=args.reply_tokens,
        seed=args.seed,
    )
    return ClusterDemoConfig(args.model, chat, args.dram_mib, args.ssd_mib)


def run(args: argparse.Namespace) -> int:
    print(run_cluster_demo(config_from_args(args)))
    return 0


def run_cluster_demo(
    config: ClusterDemoConfig, progress: bool = True, log_dir: str | None = None
) -> str:
    """Start the cluster, serve the chats, stop it; return the printed report.
    `log_dir` keeps every process's stderr there."""
    from kvstore.serving_bench.launch import Launcher, serving_argv, shm_entries

    tag = f"demo{os.getpid()}-{uuid.uuid4().hex[:6]}"
    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="kvstore-demo-") as tmp,
        Launcher(log_dir=log_dir) as procs,
    ):
        master = procs.master()
        _, prefill, decode = procs.start_many(
            [  # the decode node publishes a finished reply's KV: the next turn reuses it
                (f"{tag}-store", _storage_argv(master, config, f"{tag}-store", tmp)),
                ("prefill", serving_argv("prefill_node", model=config.model, master=master)),
                (
                    "decode",
                    serving_argv(
                        "decode_node",
                        model=config.model,
                        master=master,
                        extra=["--on-finish", "publish"],
                    ),
                ),
            ]
        )
        ready_s = time.perf_counter() - started
        records = asyncio.run(_serve_chats(config, prefill, decode, progress))
        stats = _master_stats(master)
        trouble = procs.close()
    leftovers = sorted(shm_entries(tag))
    seconds = time.perf_counter() - started
    return _report(config, records, stats, ready_s, seconds, trouble, leftovers)


def _storage_argv(master: str, config: ClusterDemoConfig, node_id: str, tmp: str) -> list[str]:
    from kvstore.serving_bench.launch import storage_argv

    argv = storage_argv(master, config.dram_mib, node_id)
    if config.ssd_mib > 0:
        argv += ["--ssd-dir", tmp, "--ssd-mib", str(config.ssd_mib)]
    return argv


async def _serve_chats(
    config: ClusterDemoConfig, prefill: str, decode: str, progress: bool
) -> list[RequestRecord]:
    """Every conversation runs its turns in order; conversations run side by side."""
    from tqdm import tqdm

    from kvstore.serving_bench.loadgen import DisaggTarget

    chats = conversations(config.chat)
    target = DisaggTarget(prefill, decode, config.model)
    total = config.chat.conversations * config.chat.turns
    bar = tqdm(total=total, desc="turns", unit="turn", disable=not progress)
    try:
        per_chat = await asyncio.gather(*(_chat(c, target, bar) for c in chats))
    finally:
        bar.close()
        await target.close()
    return [r for records in per_chat for r in records]


async def _chat(chat: Conversation, target: Any, bar: Any) -> list[RequestRecord]:
    records = []
    for _ in range(chat.spec.turns):
        record = await target.run(chat.next_turn())
        records.append(record)
        chat.add_reply(record.tokens)
        bar.update(1)
    return records


def _master_stats(master: str) -> Any:

    from kvstore.v1 import master_pb2, master_pb2_grpc

    with edge.sync_channel(master) as channel:
        return master_pb2_grpc.MasterStub(channel).Stats(master_pb2.StatsRequest(), timeout=10)


def _tier_lines(stats: Any) -> list[str]:
    from kvstore.types import Tier

    by_tier: dict[str, list[int]] = {}
    for seg in stats.segments:
        row = by_tier.setdefault(Tier(seg.tier).name, [0, 0, 0, 0])
        for i, v in enumerate((seg.hits, seg.bytes_in, seg.bytes_out, seg.evictions)):
            row[i] += v
    lookups = stats.hits + stats.misses
    lines = []
    for name, (hits, b_in, b_out, evicted) in sorted(by_tier.items()):
        lines.append(
            f"  {name:<5} {hits / max(lookups, 1):6.1%} of {lookups} pool lookups, "
            f"{b_in / MIB:7.2f} MiB in, {b_out / MIB:7.2f} MiB out, {evicted} evicted"
        )
    lines.append(f"  miss  {stats.misses / max(lookups, 1):6.1%}")
    return lines


def _report(
    config: ClusterDemoConfig,
    records: list[RequestRecord],
    stats: Any,
    ready_s: float,
    seconds: float,
    trouble: list[str],
    leftovers: list[str],
) -> str:
    s = summarize(records)
    ok = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    later = [r for r in ok if not r.request_id.endswith(".t0")]
    chat = config.chat
    ssd = f" + SSD {config.ssd_mib:g} MiB" if config.ssd_mib else ""
    lines = [
        f"local disaggregated cluster: master, storage node (DRAM {config.dram_mib:g} MiB{ssd}), "
        f"prefill node, decode node; model {config.model}; ready in {ready_s:.1f} s",
        f"{chat.conversations} conversations x {chat.turns} turns, shared "
        f"{chat.system_tokens}-token system prompt, +{chat.user_tokens} user "
        f"+{chat.reply_tokens} reply tokens per turn; {s.requests - s.failed}/{s.requests} ok",
        f"TTFT p50 {_ms(s.ttft.p50)} p99 {_ms(s.ttft.p99)}   "
        f"TBT p50 {_ms(s.tbt.p50)} p99 {_ms(s.tbt.p99)}",
        f"prefix hits: {cached}/{prompt} prompt tokens ({cached / max(prompt, 1):.1%}) from the "
        f"pool; turns after the first: "
        f"{_ratio(sum(r.cached_tokens for r in later), sum(r.prompt_tokens for r in later))}",
        "pool lookups by tier (prefix matches, prefix loads and decode pulls):",
        *_tier_lines(stats),
        _bytes_line(ok, stats),
        *[f"failed: {r.request_id}: {r.error}" for r in records if not r.ok][:3],
        f"shutdown: {'clean' if not trouble else 'trouble: ' + ', '.join(trouble)}; "
        f"{len(leftovers)} shared-memory segments left{_listed(leftovers)}; "
        f"{seconds:.1f} s in all",
    ]
    return "\n".join(lines)


def _bytes_line(ok: list[RequestRecord], stats: Any) -> str:
    """Client-side counts; the decode node's reply blocks are what the pool took in
    beyond the prefill node's writes."""
    published = sum(r.kv_bytes for r in ok)
    pool_in = sum(seg.bytes_in for seg in stats.segments)
    return (
        f"bytes moved: prefill -> pool {published / MIB:.2f} MiB, decode -> pool (replies) "
        f"{max(pool_in - published, 0) / MIB:.2f} MiB, pool -> decode "
        f"{sum(r.pulled_bytes for r in ok) / MIB:.2f} MiB"
    )


def _listed(names: list[str]) -> str:
    return f" ({', '.join(names)})" if names else ""


def _ms(x: float) -> str:
    return "-" if x != x else f"{x * 1000:.1f} ms"


def _ratio(part: int, whole: int) -> str:
    return f"{part}/{whole} ({part / max(whole, 1):.1%})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cli.cluster_demo", description=__doc__)
    add_arguments(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    print(run_cluster_demo(config_from_args(args), progress=not args.no_progress))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
