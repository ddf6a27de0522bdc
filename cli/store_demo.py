"""`kvstore store-demo`: a multi-turn shared-prefix workload through a DRAM + SSD store.

Conversations grow turn by turn; each turn's prompt is the previous prompt plus
new tokens, so its leading blocks are cached. The demo hashes each prompt into
blocks, asks the store for the longest cached prefix in one batched call, reads
the hit blocks, writes the missing ones, and prints the hit ratio per tier,
evictions, demotions, promotions and bytes moved.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvstore.hashing import block_hashes, longest_cached_prefix, make_namespace
from kvstore.types import Tier, block_key

if TYPE_CHECKING:
    from kvstore.tiers.tiered import TieredStore

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class DemoConfig:
    conversations: int = 48
    turns: int = 6
    block_tokens: int = 16
    block_bytes: int = 256 * 1024
    turn_tokens: int = 192
    dram_mib: int = 64
    ssd_mib: int = 512
    seed: int = 0


def register(sub: argparse._SubParsersAction) -> None:
    d = DemoConfig()
    p = sub.add_parser(
        "store-demo", help="a multi-turn prefix-caching workload on a local tiered store"
    )
    p.add_argument("--conversations", type=int, default=d.conversations)
    p.add_argument("--turns", type=int, default=d.turns)
    p.add_argument("--dram-mib", type=int, default=d.dram_mib)
    p.add_argument("--ssd-mib", type=int, default=d.ssd_mib)
    p.add_argument("--seed", type=int, default=d.seed)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = DemoConfig(
        conversations=args.conversations,
        turns=args.turns,
        dram_mib=args.dram_mib,
        ssd_mib=args.ssd_mib,
        seed=args.seed,
    )
    with tempfile.TemporaryDirectory(prefix="kvstore-demo-") as ssd_dir:
        report = run_store_demo(config, ssd_dir)
    print(report)
    return 0


def run_store_demo(config: DemoConfig, ssd_dir: str) -> str:
    """Drive the workload through a fresh tiered store and return the printed report."""
    from tqdm import tqdm

    from kvstore.tiers.dram import DramConfig, DramTier
    from kvstore.tiers.ssd import SsdConfig, SsdTier
    from kvstore.tiers.tiered import TieredStore

    store = TieredStore(
        [
            DramTier(DramConfig(capacity_bytes=config.dram_mib * MIB)),
            SsdTier(SsdConfig(directory=ssd_dir, capacity_bytes=config.ssd_mib * MIB)),
        ]
    )
    rng = random.Random(config.seed)
    ns = make_namespace("demo-model", kv_dtype="float16")
    payload = rng.randbytes(config.block_bytes)
    prompts = [_tokens(rng, config.turn_tokens) for _ in range(config.conversations)]
    tally = Tally()
    out = bytearray(config.block_bytes)
    started = time.perf_counter()
    try:
        for _turn in tqdm(range(config.turns), desc="turns", unit="turn"):
            order = list(range(config.conversations))
            rng.shuffle(order)
            for conv in order:
                keys = [block_key(h) for h in block_hashes(prompts[conv], config.block_tokens, ns)]
                cached = longest_cached_prefix(keys, store.batch_exists)
                for key in keys[:cached]:
                    tally.hits[store.tier_of(key) or Tier.SSD] += 1
                    store.get_into(key, out)
                for key in keys[cached:]:
                    if not store.exists(key):
                        store.put(key, payload)
                tally.lookups += len(keys)
                prompts[conv] += _tokens(rng, config.turn_tokens)
        tally.seconds = time.perf_counter() - started
        store.check_integrity()
        return _report(store, tally)
    finally:
        store.close()


@dataclass(slots=True)
class Tally:
    lookups: int = 0
    seconds: float = 0.0
    hits: dict[Tier, int] = field(default_factory=lambda: dict.fromkeys(Tier, 0))


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(256) for _ in range(n)]


def _pct(part: int, whole: int) -> str:
    return f"{part / max(whole, 1):.1%}"


def _report(store: TieredStore, tally: Tally) -> str:
    hit = sum(tally.hits.values())
    by_tier = ", ".join(
        f"{kind.name} {n} ({_pct(n, tally.lookups)})" for kind, n in tally.hits.items() if n
    )
    header = ("tier", "capacity MiB", "used MiB", "objects", "hit ratio", "evictions",
              "written MiB", "read MiB")  # fmt: skip
    rows = [
        (
            s.tier.name,
            f"{s.capacity / MIB:.1f}",
            f"{s.used / MIB:.1f}",
            str(s.objects),
            f"{s.hit_ratio:.1%}",
            str(s.evictions),
            f"{s.bytes_written / MIB:.1f}",
            f"{s.bytes_read / MIB:.1f}",
        )
        for s in store.stats()
    ]
    c = store.counters
    return "\n".join(
        [
            f"blocks looked up: {tally.lookups}, prefix hits: {hit} ({_pct(hit, tally.lookups)})"
            f" in {tally.seconds:.2f} s",
            f"hits by tier: {by_tier or 'none'}",
            "",
            *_table(header, rows),
            "",
            f"between tiers: {c.demotions} demotions ({c.bytes_demoted / MIB:.1f} MiB),"
            f" {c.promotions} promotions ({c.bytes_promoted / MIB:.1f} MiB),"
            f" {c.dropped} dropped from the last tier",
        ]
    )


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in [header, *rows]
    ]
