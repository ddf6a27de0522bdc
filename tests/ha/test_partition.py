"""A network partition of the HA leader, on emulated hosts (network namespaces).

Hosts: e (etcd), m0..m2 (masters), n (a storage node), c (a client driver). The leader's
host is cut off the switch: it loses etcd and every client. It must stop leading on its
own (before its lease ends), another master must lead within a bound, the two terms must
not overlap (no split brain: the old one's step-down is logged before the new one's
election), the client must go on through failover, and no acknowledged put may be lost.
After the cut heals, the old leader stays a follower.
"""

from __future__ import annotations

import re
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.ha.etcd import READY, TUNING, find_etcd
from tests.netns.driver import READY_LINE, DriverClient
from tests.netns.hosts import Network, Proc

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
    pytest.mark.skipif(find_etcd() is None, reason="no etcd binary (apt-get install etcd-server)"),
]
LEASE_S = 2
LEADER_LINE = re.compile(rb"kvstore master (\S+) is now leader epoch (\d+)")


def start_etcd(net: Network, workdir: Path) -> str:
    e = net.hosts["e"].address
    args = [
        str(find_etcd()), "--name", "kvs", "--data-dir", str(workdir / "etcd-data"),
        "--listen-client-urls", f"http://{e}:2379", "--advertise-client-urls", f"http://{e}:2379",
        "--listen-peer-urls", f"http://{e}:2380", "--initial-advertise-peer-urls",
        f"http://{e}:2380", "--initial-cluster", f"kvs=http://{e}:2380", "--log-outputs", "stderr",
        *TUNING,
    ]  # fmt: skip
    proc = net.spawn("e", "etcd", args)
    deadline = time.monotonic() + 20
    while READY not in proc.log.read_bytes():
        assert proc.alive() and time.monotonic() < deadline, proc.log_tail()
        time.sleep(0.05)
    return f"{e}:2379"


def start_master(net: Network, host: str, etcd: str) -> Proc:
    args = [
        sys.executable, "-m", "kvstore.master", "--listen", f"{net.hosts[host].address}:50051",
        "--etcd", etcd, "--cluster-id", "pool-netns", "--ha-lease-s", str(LEASE_S),
        "--log-level", "INFO", "--set", "node_ttl_s=6", "--set", "heartbeat_interval_s=0.2",
    ]  # fmt: skip
    proc = net.spawn(host, host, args)
    proc.reader.wait_for(b"kvstore master listening on ", 30)
    return proc


def wait_leader(masters: dict[str, Proc], timeout_s: float) -> tuple[str, int]:
    """(host, epoch) of the next master that prints that it leads."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for host, proc in masters.items():
            try:
                line = proc.reader.readline(0.05)
            except TimeoutError:
                continue
            m = LEADER_LINE.match(line)
            if m:
                return host, int(m.group(2))
    raise TimeoutError(f"no leader within {timeout_s} s")


def logged_at(proc: Proc, event: str) -> datetime:
    """When `proc` logged `event` (its stderr lines start with an asctime)."""
    for line in proc.log.read_text(errors="replace").splitlines():
        if f"event={event}" in line:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    raise AssertionError(f"{proc.name} never logged {event}: {proc.log_tail()}")


def put(driver: DriverClient, workdir: Path, key: str) -> bool:
    path = workdir / f"v-{key}"
    path.write_bytes(key.encode() * 100)
    reply = driver.call(op="put", key=key, path=str(path), replicas=1)
    if not reply["ok"]:
        print("put failed:", key, reply)
    return bool(reply["ok"])


def test_partitioned_leader_steps_down_and_a_follower_takes_over(tmp_path: Path) -> None:
    with Network(["e", "m0", "m1", "m2", "n", "c"], tmp_path) as net:
        etcd = start_etcd(net, tmp_path)
        masters = {h: start_master(net, h, etcd) for h in ("m0", "m1", "m2")}
        old, old_epoch = wait_leader(masters, 20)
        every = ",".join(f"{net.hosts[h].address}:50051" for h in masters)
        node = net.spawn("n", "node", [
            sys.executable, "-m", "kvstore.node", "--master", every, "--node-id", "n0",
            "--dram-mib", "16", "--heartbeat-s", "0.2", "--host", net.hosts["n"].address,
        ])  # fmt: skip
        node.reader.wait_for(b"kvstore node ", 30)
        proc = net.spawn("c", "driver", [
            sys.executable, "-m", "tests.netns.driver", "--master", every, "--timeout-s", "3",
        ], stdin=True)  # fmt: skip
        proc.reader.wait_for(READY_LINE, 30)
        driver = DriverClient(proc.popen, proc.reader)
        acked = [k for k in (f"before{i}" for i in range(20)) if put(driver, tmp_path, k)]
        assert len(acked) == 20

        cut_at = time.monotonic()
        net.partition(old)
        new, new_epoch = wait_leader({h: p for h, p in masters.items() if h != old}, 15)
        took_s = time.monotonic() - cut_at
        assert new != old and new_epoch > old_epoch
        assert took_s < 10, took_s
        # no split brain: the old term ended (on the old leader's own clock) before the
        # new one began; both run on this machine's clock
        assert logged_at(masters[old], "leader_stepped_down") < logged_at(
            masters[new], "leader_elected"
        )

        deadline, after = time.monotonic() + 20, []
        while len(after) < 10 and time.monotonic() < deadline:
            key = f"after{len(after)}-{time.monotonic_ns()}"
            if put(driver, tmp_path, key):  # the first may time out on the cut host: typed
                after.append(key)
        assert len(after) == 10
        print(f"partition: new leader after {took_s:.2f} s, 10 puts done "
              f"{time.monotonic() - cut_at:.2f} s after the cut")  # fmt: skip
        net.heal(old)
        time.sleep(1.0)
        for key in [*acked, *after]:
            out = tmp_path / f"out-{key}"
            reply = driver.call(op="get", key=key, out=str(out))
            assert reply["ok"], reply
            assert out.read_bytes() == key.encode() * 100
        assert b"is now leader" not in masters[old].reader._buf  # healed: still a follower
