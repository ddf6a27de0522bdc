"""Jepsen-style linearizability check of an HA pool, over randomized runs.

    python bench/jepsen.py [--runs 20] [--seconds 20] [--clients 4] [--keys 8] [--seed 1] [--json]

Each run (tests/ha/jepsen.py): etcd, 3 masters, a storage node and `--clients` client
processes on their own emulated hosts (network namespaces; needs root, `ip netns` and
etcd-server). The clients run random put/get/remove on `--keys` keys, recording every
op (invoke and completion, monotonic times); a nemesis applies random faults to the
leader of the moment: SIGKILL (then restarted), a partition of its host (etcd, the node
and every client cut off; then healed) or a clean handover (SIGTERM). Every key's
history is then checked against a register model (tests/ha/history.py: Wing-Gong-Lowe
search; ops of unknown outcome may have happened or not).

Target (issue 11): 0 linearizability violations over >= 20 runs.
Writes bench/results/jepsen.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.ha.etcd import find_etcd  # noqa: E402
from tests.ha.jepsen import FAULTS, INFO_GRACE_S, run_once  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--seconds", type=float, default=20.0, help="client time per run")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--keys", type=int, default=8)
    p.add_argument("--seed", type=int, default=1, help="run i uses seed + i")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--keep", action="store_true", help="keep each run's logs and histories")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "jepsen.json"))
    args = p.parse_args()
    if find_etcd() is None:
        print("bench/jepsen.py: no etcd binary (apt-get install etcd-server)", file=sys.stderr)
        return 4
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("bench/jepsen.py: needs root and `ip netns`", file=sys.stderr)
        return 4
    root = Path(tempfile.mkdtemp(prefix="kvs-jepsen-"))
    rows = []
    started = time.monotonic()
    for i in range(args.runs):
        workdir = root / f"run{i}"
        workdir.mkdir()
        r = run_once(workdir, args.seed + i, args.seconds, args.clients, args.keys)
        rows.append(r)
        kinds = ",".join(f["fault"] for f in r["faults"])
        if not args.json:
            print(f"run {i:>2} seed {r['seed']:>3}: {r['ops']:>4} ops, faults {kinds:<32} "
                  f"violations {r['violations']} unknown {r['unknown']}", flush=True)  # fmt: skip
        if not args.keep and not r["violations"]:
            shutil.rmtree(workdir, ignore_errors=True)
    outcomes: dict[str, int] = {}
    errors: dict[str, int] = {}
    for r in rows:
        for k, v in r["outcomes"].items():
            outcomes[k] = outcomes.get(k, 0) + v
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    faults = {f: sum(1 for r in rows for x in r["faults"] if x["fault"] == f) for f in FAULTS}
    new_leader = [x["new_leader_s"] for r in rows for x in r["faults"]]
    result = {
        "bench": "jepsen", "runs": args.runs, "seconds_per_run": args.seconds,
        "clients": args.clients, "keys": args.keys, "seed": args.seed,
        "info_grace_s": INFO_GRACE_S,
        "ops": sum(r["ops"] for r in rows), "outcomes": dict(sorted(outcomes.items())),
        "errors": dict(sorted(errors.items())), "faults": faults,
        "new_leader_s_max": max(new_leader, default=0.0),
        "violations": sum(r["violations"] for r in rows),
        "runs_with_violations": sum(1 for r in rows if r["violations"]),
        "unknown": sum(r["unknown"] for r in rows),
        "self_reported_overlaps": sum(len(r["self_reported_overlaps"]) for r in rows),
        "wall_s": round(time.monotonic() - started, 1),
        "met": all(r["violations"] == 0 and r["unknown"] == 0 for r in rows) and args.runs >= 20,
        "rows": rows,
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
        return 0
    print(f"runs {args.runs}, ops {result['ops']} ({result['outcomes']}), faults {faults}")
    print(f"violations {result['violations']} (runs with one: {result['runs_with_violations']}),"
          f" searches given up {result['unknown']}; target 0 over >= 20 runs: "
          f"{'met' if result['met'] else 'NOT MET'}")  # fmt: skip
    if result["violations"]:
        print(f"kept the failing runs under {root}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
