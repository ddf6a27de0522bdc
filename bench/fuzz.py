"""Long fuzz run of the trust boundary (issue 10, point 6): hypothesis-built requests for
every Master RPC (valid, boundary and garbage fields, and raw garbage) against a live
master (in-process, so its invariants are checked directly) and storage node, plus raw
bytes on the storage node's TCP data plane. After every case: a typed status, the master
answers Stats, check_integrity holds (metadata and the quota ledger), and a pinned canary
object reads back byte for byte. Prints the cases tried, the statuses seen, and crashes,
hangs and integrity failures (each 0, or the run stops at the first with its case).

    python bench/fuzz.py [--cases 100000] [--frames 20000] [--seed 0] [--json] [--quick]

The CI-sized share is tests/security/test_fuzz.py. Target: >= 100,000 requests, 0
crashes, 0 hangs, 0 integrity failures.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hypothesis import HealthCheck, assume, given, seed, settings  # noqa: E402

from tests.security.fuzzing import FuzzTarget, frames, requests, send_frame  # noqa: E402
from tests.security.helpers import InProcessMaster  # noqa: E402


def run(cases: int, n_frames: int, rng_seed: int) -> dict[str, object]:
    statuses: Counter[str] = Counter()
    methods: Counter[str] = Counter()
    skipped = 0
    started = time.monotonic()
    with InProcessMaster(
        None, put_timeout_s=1.0, node_ttl_s=60.0, heartbeat_interval_s=1.0
    ) as master:
        target = FuzzTarget(master)
        opts = settings(
            max_examples=cases, deadline=None, database=None,
            suppress_health_check=list(HealthCheck),
        )  # fmt: skip

        @seed(rng_seed)
        @opts
        @given(case=requests())
        def master_rpcs(case: tuple[str, bytes]) -> None:
            nonlocal skipped
            method, raw = case
            if target.protected(method, raw):
                skipped += 1
                assume(False)
            statuses[target.case(method, raw).name] += 1
            methods[method] += 1
            if target.cases % 10_000 == 0:
                print(f"  {target.cases} cases, {time.monotonic() - started:.0f} s", flush=True)

        @seed(rng_seed)
        @settings(opts, max_examples=n_frames)
        @given(data=frames())
        def data_plane(data: bytes) -> None:
            send_frame(target.node.endpoint, data)
            target.check()
            statuses["frames"] += 1

        master_rpcs()
        rpc_s = time.monotonic() - started
        if n_frames:
            data_plane()
        target.check()
        target.close()
    return {
        "requests": target.cases, "frames": statuses.pop("frames", 0), "skipped": skipped,
        "statuses": dict(statuses), "methods": len(methods), "per_method": dict(methods),
        "crashes": 0, "hangs": 0, "integrity_failures": 0,
        "rpc_seconds": round(rpc_s, 1), "slowest_call_s": round(target.slowest[0], 3),
        "slowest_method": target.slowest[1], "seconds": round(time.monotonic() - started, 1),
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=100_000)
    p.add_argument("--frames", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="1,000 requests and 200 frames")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    logging.getLogger("kvstore").setLevel(logging.ERROR)  # fuzzed nodes die by the thousand
    cases, n_frames = (1000, 200) if args.quick else (args.cases, args.frames)
    out = run(cases, n_frames, args.seed)
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    print(f"fuzz: {out['requests']} master requests over {out['methods']} RPCs, "
          f"{out['frames']} data-plane frames, {out['seconds']} s")  # fmt: skip
    for name, n in sorted(out["statuses"].items(), key=lambda kv: -kv[1]):  # type: ignore[union-attr]
        print(f"  {name:<20} {n:>8}")
    print(f"slowest call {out['slowest_call_s']} s ({out['slowest_method']})")
    print(f"crashes {out['crashes']}  hangs {out['hangs']}  integrity failures "
          f"{out['integrity_failures']}  (a failure stops the run with its case)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
