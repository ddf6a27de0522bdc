"""One Jepsen-style run against an HA pool on emulated hosts (network namespaces).

    result = run_once(workdir, seed=3, seconds=20)   # a dict; result["violations"] == 0

Hosts: e (etcd), m0..m2 (masters), n (a storage node), c (the client processes). While
`clients` processes (tests/ha/jepsen_client.py) run random put/get/remove on a few keys
and record every op, a nemesis picks faults at random (seeded) and applies them to the
leader of the moment: `kill` (SIGKILL, restarted after a pause), `partition` (its host
cut off from the switch: etcd, the node and every client; healed after a pause) or
`handover` (SIGTERM: it resigns; restarted). Faults stop a few seconds before the
clients do, so the last ops see a healed pool. Then every key's history is checked
for linearizability against the register model (tests/ha/history.py).
"""

from __future__ import annotations

import contextlib
import random
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.ha.etcd import READY as ETCD_READY
from tests.ha.etcd import TUNING as ETCD_TUNING
from tests.ha.etcd import find_etcd
from tests.ha.history import check, explain, load_ops
from tests.ha.jepsen_client import READY as CLIENT_READY
from tests.netns.hosts import Network, Proc

FAULTS = ("kill", "partition", "handover")
MASTERS = ("m0", "m1", "m2")
LEASE_S = 2
# How long after its client stopped waiting an op of unknown outcome may still take
# effect: a leader's write lands in etcd within its lease (later ones are fenced), and
# the client's wait began after the leader had the request.
INFO_GRACE_S = 2 * LEASE_S + 1.0
EXPECTED_ERRORS = frozenset(
    {"ExistsError", "NotReadyError", "UnavailableError", "NotLeaderError", "NotFoundError"}
)
ROLE_LINE = re.compile(rb"kvstore master (\S+) is now (leader|follower) epoch (\d+)")


@dataclass
class Roles:
    """Each master's role as its stdout lines announce them (one reader thread each)."""

    events: list[tuple[float, str, str, int]] = field(default_factory=list)  # t, host, role, epoch
    lock: threading.Lock = field(default_factory=threading.Lock)
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    def follow(self, host: str, proc: Proc) -> None:
        def read() -> None:
            while True:
                try:
                    line = proc.reader.readline(3600)
                except (EOFError, TimeoutError, OSError, ValueError):
                    return
                m = ROLE_LINE.match(line)
                if m:
                    with self.changed:
                        self.events.append(
                            (time.monotonic(), host, m.group(2).decode(), int(m.group(3)))
                        )
                        self.changed.notify_all()

        threading.Thread(target=read, daemon=True).start()

    def leader(self) -> tuple[str, int] | None:
        """(host, epoch) of the master whose last word is that it leads, newest epoch."""
        last: dict[str, tuple[str, int]] = {}
        for _, host, role, epoch in self.events:
            last[host] = (role, epoch)
        leading = [(epoch, host) for host, (role, epoch) in last.items() if role == "leader"]
        return (max(leading)[1], max(leading)[0]) if leading else None

    def wait_leader(self, timeout_s: float, newer_than: int = 0) -> tuple[str, int]:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while True:
                got = self.leader()
                if got is not None and got[1] > newer_than:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no leader newer than epoch {newer_than} in {timeout_s} s")
                self.changed.wait(left)

    def forget(self, host: str) -> None:
        """`host`'s master is gone (killed): it leads no more."""
        with self.changed:
            self.events.append((time.monotonic(), host, "follower", 0))

    def overlapping_terms(self) -> list[str]:
        """Pairs of masters that both said they led at one time (by their own lines:
        only a lower bound of split brain; the history check is the real test)."""
        out, leading = [], {}
        for t, host, role, epoch in self.events:
            if role == "leader":
                others = [h for h in leading if h != host]
                out += [f"{host}@{epoch} while {h}@{leading[h]} (t={t:.2f})" for h in others]
                leading[host] = epoch
            else:
                leading.pop(host, None)
        return out


class Pool:
    """etcd, three masters, one node, on their own hosts."""

    def __init__(self, net: Network, workdir: Path) -> None:
        self.net = net
        self.workdir = workdir
        self.roles = Roles()
        self.masters: dict[str, Proc] = {}
        self.starts = 0
        self.etcd = self._start_etcd()
        for host in MASTERS:
            self.start_master(host)
        self.every = ",".join(f"{net.hosts[h].address}:50051" for h in MASTERS)

    def _start_etcd(self) -> str:
        e = self.net.hosts["e"].address
        args = [
            str(find_etcd()), "--name", "kvs", "--data-dir", str(self.workdir / "etcd-data"),
            "--listen-client-urls", f"http://{e}:2379", "--advertise-client-urls",
            f"http://{e}:2379", "--listen-peer-urls", f"http://{e}:2380",
            "--initial-advertise-peer-urls", f"http://{e}:2380",
            "--initial-cluster", f"kvs=http://{e}:2380", "--log-outputs", "stderr",
            *ETCD_TUNING,
        ]  # fmt: skip
        proc = self.net.spawn("e", "etcd", args)
        deadline = time.monotonic() + 30
        while ETCD_READY not in proc.log.read_bytes():
            if not proc.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start: {proc.log_tail()}")
            time.sleep(0.05)  # polling another process's log
        return f"{e}:2379"

    def start_master(self, host: str) -> None:
        args = [
            sys.executable, "-m", "kvstore.master", "--listen",
            f"{self.net.hosts[host].address}:50051", "--etcd", self.etcd,
            "--cluster-id", "pool-jepsen", "--ha-lease-s", str(LEASE_S), "--log-level", "INFO",
            "--lease-ttl-s", "0.2", "--set", "node_ttl_s=8", "--set", "heartbeat_interval_s=0.2",
        ]  # fmt: skip
        self.starts += 1
        proc = self.net.spawn(host, f"{host}-{self.starts}", args)
        proc.reader.wait_for(b"kvstore master listening on ", 60)
        self.masters[host] = proc
        self.roles.follow(host, proc)

    def start_node(self) -> Proc:
        node = self.net.spawn("n", "node", [
            sys.executable, "-m", "kvstore.node", "--master", self.every, "--node-id", "n0",
            "--dram-mib", "64", "--heartbeat-s", "0.2", "--host", self.net.hosts["n"].address,
        ])  # fmt: skip
        node.reader.wait_for(b"kvstore node ", 60)
        return node


def nemesis(pool: Pool, rng: random.Random, until: float, schedule: list[str]) -> list[dict]:
    """Apply faults to the leader until `until`; the fault log."""
    log: list[dict[str, Any]] = []
    k = 0
    while time.monotonic() < until - 6:
        time.sleep(rng.uniform(1.0, 2.5))
        host, epoch = pool.roles.wait_leader(20)
        fault = schedule[k % len(schedule)] if schedule else rng.choice(FAULTS)
        k += 1
        t0 = time.monotonic()
        entry: dict[str, Any] = {"fault": fault, "host": host, "epoch": epoch, "at": t0}
        proc = pool.masters[host]
        if fault == "partition":
            pool.net.partition(host)
            new = pool.roles.wait_leader(20, newer_than=epoch)
            entry["new_leader_s"] = round(time.monotonic() - t0, 3)
            time.sleep(rng.uniform(0.5, 3.0))
            pool.net.heal(host)
        else:
            proc.popen.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGTERM)
            proc.popen.wait(15)
            pool.roles.forget(host)
            new = pool.roles.wait_leader(20, newer_than=epoch)
            entry["new_leader_s"] = round(time.monotonic() - t0, 3)
            time.sleep(rng.uniform(0.2, 2.0))
            pool.start_master(host)
        entry["new"] = new[0]
        entry["new_epoch"] = new[1]
        log.append(entry)
    return log


def run_once(
    workdir: Path, seed: int, seconds: float = 20.0, clients: int = 4, keys: int = 8,
    schedule: list[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One run: the pool, the clients and the nemesis; the checked result."""
    rng = random.Random(seed)
    hosts = ["e", *MASTERS, "n", "c"]
    started = time.monotonic()
    with Network(hosts, workdir) as net:
        pool = Pool(net, workdir)
        pool.roles.wait_leader(30)
        pool.start_node()
        procs = []
        for p in range(clients):
            procs.append(net.spawn("c", f"client{p}", [
                sys.executable, "-m", "tests.ha.jepsen_client", "--master", pool.every,
                "--process", str(p), "--seconds", str(seconds), "--keys", str(keys),
                "--seed", str(seed * 1000 + p), "--out", str(workdir / f"h{p}.jsonl"),
            ]))  # fmt: skip
        for proc in procs:
            proc.reader.wait_for(CLIENT_READY, 60)
        faults = nemesis(pool, rng, time.monotonic() + seconds, list(schedule or []))
        for proc in procs:
            proc.popen.wait(seconds + 60)
        exits = [proc.popen.returncode for proc in procs]
        terms = pool.roles.overlapping_terms()
    ops = load_ops([workdir / f"h{p}.jsonl" for p in range(clients)], INFO_GRACE_S)
    report = check(ops)
    out: dict[str, Any] = {"seed": seed, **report.summary(), "faults": faults,
                           "client_exits": exits, "self_reported_overlaps": terms,
                           "seconds": round(time.monotonic() - started, 1)}  # fmt: skip
    errors: dict[str, int] = {}
    rare: list[str] = []  # the messages of errors other than the expected kinds
    for op in ops:
        if op.error:
            kind = op.error.split(":")[0]
            errors[f"{op.f}:{kind}"] = errors.get(f"{op.f}:{kind}", 0) + 1
            if kind not in EXPECTED_ERRORS and len(rare) < 10:
                rare.append(f"{op.f}: {op.error}")
    out["errors"] = dict(sorted(errors.items()))
    out["rare_errors"] = rare
    out["explained"] = [explain(k, ops) for k in report.violations[:3]]
    with contextlib.suppress(OSError):
        (workdir / "result.txt").write_text("\n\n".join(out["explained"]))
    return out
