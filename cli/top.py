"""`kvstore top`: a live view of the pool, refreshed every `--interval-s` (Ctrl-C ends):
the status screen, the per node/tier table and the rates since the previous frame.

    kvstore top [--master HOST:PORT] [--interval-s 2] [--iterations N]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from cli.admin import stats_doc, status_text
from cli.common import admin_parent, master_api
from cli.errors import guarded
from cli.tiers_view import human_bytes, pool_row, render_table, tier_rows
from kvstore.errors import BadRequestError
from kvstore.v1 import master_pb2

CLEAR = "\x1b[H\x1b[2J"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("top", help="live view of the pool", parents=[admin_parent()])
    p.add_argument("--interval-s", type=float, default=2.0)
    p.add_argument("--iterations", type=int, default=0, help="frames to draw (0 = until Ctrl-C)")
    p.set_defaults(handler=guarded("kvstore top", run))


def frame(stats: master_pb2.StatsResponse, master: str, prev: tuple[float, int, int] | None,
          now: float) -> str:  # fmt: skip
    doc = stats_doc(stats, master)
    pool = pool_row(stats)
    rate = ""
    if prev is not None and now > prev[0]:
        dt = now - prev[0]
        rate = (
            f"rates  {(stats.hits + stats.misses - prev[1]) / dt:.1f} lookups/s, "
            f"{human_bytes(int((pool.bytes_out - prev[2]) / dt))}/s out"
        )
    return "\n".join([status_text(doc), rate, "", render_table(tier_rows(stats), pool)])


def run(args: argparse.Namespace) -> int:
    if args.interval_s <= 0 or args.iterations < 0:
        raise BadRequestError("--interval-s must be > 0 and --iterations >= 0")
    tick = threading.Event()  # never set: its wait is the refresh interval, Ctrl-C ends
    prev: tuple[float, int, int] | None = None
    drawn = 0
    with master_api(args) as api:
        while not args.iterations or drawn < args.iterations:
            stats = api.call("Stats", master_pb2.StatsRequest())
            now = time.monotonic()
            clear = CLEAR if sys.stdout.isatty() else ""
            print(clear + frame(stats, api.address, prev, now), flush=True)
            prev = (now, stats.hits + stats.misses, pool_row(stats).bytes_out)
            drawn += 1
            if not args.iterations or drawn < args.iterations:
                tick.wait(args.interval_s)
    return 0
