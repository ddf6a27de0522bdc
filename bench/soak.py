"""Soak: many clients against a 3-master (etcd), 3-node pool for a while.

    python bench/soak.py [--seconds 1800] [--clients 8] [--ci] [--kill-leader-every S] [--json]
                         [--keep-workdir]

Each client thread loops: put a fresh key (4 KiB, deterministic bytes), read back one of
its recent keys, now and then remove one. The pool is smaller than what is written,
so eviction runs throughout (a NoSpaceError is backpressure: counted, never fatal).
Every `--sample-s` the RSS of every process (masters, nodes, etcd, this one) is
sampled; after a warm-up (the first quarter) its slope is fitted (MiB/min). At the end
every key a client still believes present is read: a wrong byte is an integrity
failure; a missing key must have been evicted (the master counts evictions). That
belief is one byte per put (`Worker.present`, a bytearray by key number), so this
process's own bookkeeping grows ~0.02 MiB/min and its RSS slope is the clients'.
`--ci` is a 3-minute run. Targets (issue 11): RSS slope of every process < 1 MiB/min
after warm-up, 0 integrity failures. Writes bench/results/soak.json. The temporary
directory (etcd's data, the processes' logs) is removed at the end unless --keep-workdir.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvstore.client import Client  # noqa: E402
from kvstore.errors import CorruptError, KVStoreError, NoSpaceError, NotFoundError  # noqa: E402
from tests.ha.etcd import Etcd, find_etcd  # noqa: E402
from tests.ha.hacluster import HACluster  # noqa: E402
from tests.ha.storm import value_of  # noqa: E402

VALUE = 4096


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def slope_mib_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute."""
    if len(points) < 3:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return 60 * sum((t - mx) * (v - my) for t, v in points) / var if var else 0.0


class Worker(threading.Thread):
    def __init__(self, address: str, w: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.address, self.w, self.stop = address, w, stop
        self.present = bytearray()  # by key number: 1 = put and not known gone
        self.recent: list[int] = []
        self.counts = {"put": 0, "get": 0, "remove": 0, "no_space": 0, "errors": 0}
        self.error_types: set[str] = set()
        self.untyped: list[str] = []
        self.rng = random.Random(w)

    def run(self) -> None:
        with Client(self.address, failover_timeout_s=30) as c:
            n = 0
            while not self.stop.is_set():
                try:
                    self.step(c, n)
                except NoSpaceError:
                    self.counts["no_space"] += 1
                    time.sleep(0.05)  # back off as the error asks
                except KVStoreError as exc:
                    self.counts["errors"] += 1
                    self.error_types.add(type(exc).__name__)
                except Exception as exc:  # recorded: the run fails on any
                    self.untyped.append(repr(exc))
                n += 1

    def key(self, n: int) -> str:
        return f"soak/w{self.w}/{n}"

    def step(self, c: Client, n: int) -> None:
        self.present.append(0)
        c.put(self.key(n), value_of(self.key(n), VALUE))
        self.present[n] = 1
        self.recent = [*self.recent[-63:], n]
        self.counts["put"] += 1
        probe = self.rng.choice(self.recent)
        try:
            got = c.get(self.key(probe))
            self.counts["get"] += 1
            if got != value_of(self.key(probe), VALUE):
                raise CorruptError(f"{self.key(probe)} read back wrong bytes")
        except NotFoundError:
            self.present[probe] = 0  # evicted
        if self.rng.random() < 0.05:
            gone = self.recent.pop(0)
            if self.present[gone] and c.remove(self.key(gone)):
                self.counts["remove"] += 1
            self.present[gone] = 0


def integrity(address: str, workers: list[Worker]) -> dict[str, int]:
    ok = missing = bad = 0
    with Client(address, failover_timeout_s=30) as c:
        for w in workers:
            keys = [w.key(n) for n, there in enumerate(w.present) if there]
            for i in range(0, len(keys), 256):
                part = keys[i : i + 256]
                try:
                    values = c.batch_get(part)
                except CorruptError:
                    bad += len(part)
                    continue
                for key, got in zip(part, values, strict=True):
                    if got is None:
                        missing += 1
                    elif got == value_of(key, VALUE):
                        ok += 1
                    else:
                        bad += 1
    return {"verified": ok, "evicted": missing, "integrity_failures": bad}


def processes(c: HACluster, etcd: Etcd) -> dict[str, int]:
    import os

    out = {f"master{i}": p.pid for i, p in enumerate(c.master_procs) if p is not None}
    out.update({n.node_id.split("-")[0]: n.proc.pid for n in c.node_procs})
    if etcd.proc is not None:
        out["etcd"] = etcd.proc.pid
    out["clients"] = os.getpid()
    return out


def run(
    args: argparse.Namespace, seconds: float, workdir: Path
) -> tuple[dict[str, list[tuple[float, float]]], int, list[Worker], dict[str, int], int]:
    """The soak itself: RSS samples by process, leader kills, workers, integrity, evictions."""
    samples: dict[str, list[tuple[float, float]]] = {}
    kills = 0
    with Etcd(workdir / "etcd") as etcd, HACluster(
        etcd=etcd, masters=3, nodes=3, dram_bytes=16 << 20, workdir=workdir
    ) as c:  # fmt: skip
        stop = threading.Event()
        workers = [Worker(c.address, w, stop) for w in range(args.clients)]
        for w in workers:
            w.start()
        t0 = time.monotonic()
        next_kill = t0 + args.kill_leader_every if args.kill_leader_every else float("inf")
        while (now := time.monotonic()) - t0 < seconds:
            for name, pid in processes(c, etcd).items():
                mib = rss_mib(pid)
                if mib is not None:
                    samples.setdefault(name, []).append((now - t0, mib))
            if now >= next_kill:
                i = c.wait_leader()
                c.kill_master(i, signal.SIGKILL)
                c.wait_leader(not_=i)
                c.start_one_master(i)
                kills += 1
                next_kill = now + args.kill_leader_every
                samples = {k: v for k, v in samples.items() if not k.startswith(f"master{i}")}
            time.sleep(args.sample_s)
        stop.set()
        for w in workers:
            w.join(60)
        check = integrity(c.address, workers)
        evictions = int(c.stats().evictions)
    return samples, kills, workers, check, evictions


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=1800)
    p.add_argument("--ci", action="store_true", help="a 3-minute run")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--kill-leader-every", type=float, default=0.0, help="0 = never")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "soak.json"))
    p.add_argument("--keep-workdir", action="store_true", help="keep etcd's data and the logs")
    args = p.parse_args()
    if find_etcd() is None:
        print("bench/soak.py: no etcd binary (apt-get install etcd-server)", file=sys.stderr)
        return 4
    seconds = 180.0 if args.ci else args.seconds
    workdir = Path(tempfile.mkdtemp(prefix="kvs-soak-"))
    try:
        samples, kills, workers, check, evictions = run(args, seconds, workdir)
    finally:
        if args.keep_workdir:
            print(f"bench/soak.py: logs and etcd data kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    warm = seconds / 4
    slopes = {
        name: round(slope_mib_per_min([pt for pt in pts if pt[0] >= warm]), 3)
        for name, pts in samples.items()
    }
    counts = {k: sum(w.counts[k] for w in workers) for k in workers[0].counts}
    untyped = [u for w in workers for u in w.untyped]
    result = {
        "bench": "soak", "seconds": seconds, "clients": args.clients, "masters": 3,
        "nodes": 3, "leader_kills": kills, "ops": counts,
        "ops_per_s": round((counts["put"] + counts["get"]) / seconds),
        "error_types": sorted({t for w in workers for t in w.error_types}),
        "untyped_errors": len(untyped), "evictions": evictions, **check,
        "rss_slope_mib_per_min": slopes,
        "rss_last_mib": {k: round(v[-1][1], 1) for k, v in samples.items() if v},
        "target_slope_mib_per_min": 1.0,
        "met": max(slopes.values(), default=0.0) < 1.0 and check["integrity_failures"] == 0
        and not untyped,
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"soak {seconds:.0f} s, {args.clients} clients, 3 masters, 3 nodes, {kills} leader kills")
    print(f"ops {counts} ({result['ops_per_s']}/s), errors {result['error_types'] or '-'}, "
          f"untyped {len(untyped)}")  # fmt: skip
    print(f"integrity: {check['verified']} verified, {check['evicted']} evicted, "
          f"{check['integrity_failures']} failures (master evictions {evictions})")  # fmt: skip
    for name in sorted(slopes):
        print(f"  RSS {name:>8}: {result['rss_last_mib'][name]:8.1f} MiB, "
              f"slope {slopes[name]:+.3f} MiB/min after warm-up")  # fmt: skip
    print(f"target slope < 1 MiB/min, 0 integrity failures: {'met' if result['met'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
