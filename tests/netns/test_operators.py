"""docs/operators.md, step by step, on emulated hosts (network namespaces, see hosts.py):

host a: `kvstore master --config master.toml --metrics-listen A:9100` and the admin CLI
host b, c: `kvstore node --config node-b.toml` / node-c.toml (DRAM, and SSD on c)
then: status and nodes from host a, clients write from a and read from c, /metrics
scraped, node b drained before its "upgrade" (objects move to c, read back the same),
b stopped and started again, uncordoned, and new objects land on it again.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.netns.driver import READY_LINE, DriverClient
from tests.netns.hosts import Host, Network, Proc

pytestmark = [pytest.mark.netns, pytest.mark.timeout(300)]
MASTER_PORT = 50051
METRICS_PORT = 9100
START_S = 60.0


def cli(host: Host, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """One `kvstore` command run in `host`."""
    return subprocess.run(
        ["ip", "netns", "exec", host.netns, sys.executable, "-m", "cli.main", *args],
        capture_output=True, text=True, env=host.env(), timeout=timeout_s,
    )  # fmt: skip


def cli_json(host: Host, *args: str) -> Any:
    res = cli(host, *args, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def start_node(net: Network, host: str, config: str) -> Proc:
    proc = net.spawn(host, f"node-{host}", [sys.executable, "-m", "cli.main", "node",
                                            "--config", config])  # fmt: skip
    line = proc.reader.wait_for(b"kvstore node ", START_S)
    assert b" ready on " in line, proc.log_tail()
    return proc


def driver(net: Network, host: str, master: str) -> DriverClient:
    args = [sys.executable, "-m", "tests.netns.driver", "--master", master, "--timeout-s", "5"]
    proc = net.spawn(host, f"driver-{host}", args, stdin=True)
    proc.reader.wait_for(READY_LINE, START_S)
    return DriverClient(proc.popen, proc.reader)


def test_operators_guide_on_three_hosts(tmp_path: Path) -> None:
    with Network(["a", "b", "c"], tmp_path) as net:
        a, b, c = (net.hosts[h] for h in "abc")
        master = f"{a.address}:{MASTER_PORT}"
        # 1. the master, from its config file
        master_toml = write(tmp_path / "master.toml", (
            f'[master]\nlisten = "{master}"\nnode_ttl_s = 5.0\nheartbeat_interval_s = 0.5\n'
            f'db_path = "{tmp_path / "master-db"}"\n'
        ))  # fmt: skip
        args = ["master", "--config", master_toml, "--metrics-listen", f"{a.address}:9100"]
        m = net.spawn("a", "master", [sys.executable, "-m", "cli.main", *args])
        assert m.reader.wait_for(b"kvstore master listening on ", START_S)
        # 2. a storage node per host, each from its own config file
        (tmp_path / "ssd-c").mkdir()
        configs = {
            "b": f'[node]\nmaster = "{master}"\nnode_id = "node-b"\nlisten_host = "{b.address}"\n'
                 "dram_bytes = 8388608\n",
            "c": f'[node]\nmaster = "{master}"\nnode_id = "node-c"\nlisten_host = "{c.address}"\n'
                 f'dram_bytes = 8388608\nssd_dir = "{tmp_path / "ssd-c"}"\nssd_bytes = 8388608\n',
        }  # fmt: skip
        node_b = start_node(net, "b", write(tmp_path / "node-b.toml", configs["b"]))
        start_node(net, "c", write(tmp_path / "node-c.toml", configs["c"]))
        # 3. the admin CLI from host a: --master given once, in [cli]
        cli_toml = write(tmp_path / "cli.toml", f'[cli]\nmaster = "{master}"\n')
        status = cli_json(a, "status", "--config", cli_toml)
        assert status["nodes"] == 2 and status["capacity"] == 3 * (8 << 20)
        nodes = cli_json(a, "nodes", "--config", cli_toml)
        assert [n["node_id"] for n in nodes] == ["node-b", "node-c"]
        # 4. clients on a write, a client on c reads
        on_a, on_c = driver(net, "a", master), driver(net, "c", master)
        data = {}
        for i in range(6):
            key = f"op/{i}"
            data[key] = random.Random(key).randbytes(200_000 + i)
            path = tmp_path / f"{i}.in"
            path.write_bytes(data[key])
            on_a.ok(op="put", key=key, path=str(path), replicas=1)
        before = on_a.ok(op="holders")["holders"]
        on_b = sorted(k for k, n in before.items() if n == ["node-b"])
        assert on_b, before
        # 5. metrics of the master, from host a
        scrape = subprocess.run(
            ["ip", "netns", "exec", a.netns, sys.executable, "-c",
             f"import urllib.request; print(urllib.request.urlopen("
             f"'http://{a.address}:{METRICS_PORT}/metrics', timeout=5).read().decode())"],
            capture_output=True, text=True, timeout=30, env=a.env(),
        )  # fmt: skip
        assert 'kvstore_tier_capacity_bytes{node="node-b",segment=' in scrape.stdout
        # 6. drain b before its upgrade: its objects move to c, the same bytes
        drained = cli_json(a, "drain", "node-b", "--config", cli_toml)
        assert drained["moved"] == len(on_b) and drained["lost"] == []
        after = on_a.ok(op="holders")["holders"]
        assert all(n == ["node-c"] for n in after.values()), after
        for key, value in data.items():
            out = tmp_path / f"{key.replace('/', '_')}.out"
            on_c.ok(op="get", key=key, out=str(out))
            assert out.read_bytes() == value, key
        # 7. stop b, start the "upgraded" b, uncordon it: new objects may land there again
        node_b.popen.send_signal(signal.SIGTERM)
        assert node_b.popen.wait(30) == 0
        start_node(net, "b", str(tmp_path / "node-b.toml"))
        res = cli(a, "uncordon", "node-b", "--config", cli_toml)
        assert res.returncode == 0 and "cordoned now: none" in res.stdout
        path = tmp_path / "new.in"
        path.write_bytes(b"n" * 100_000)
        # The writer's current extent lease may still be on c; the next extent (a 16th of
        # a segment, ~5 of these puts) goes to the most free node: b. Bounded.
        landed: list[str] = []
        for i in range(20):
            on_a.ok(op="put", key=f"op/new{i}", path=str(path), replicas=1)
            landed = on_a.ok(op="holders")["holders"][f"op/new{i}"]
            if landed == ["node-b"]:
                break
        assert landed == ["node-b"]  # new objects land on the upgraded b again
        # 8. a master that is down: one line, exit 4, within the deadline
        m.popen.send_signal(signal.SIGTERM)
        assert m.popen.wait(30) == 0
        res = cli(a, "status", "--config", cli_toml, "--timeout-s", "1")
        assert res.returncode == 4 and len(res.stderr.strip().splitlines()) == 1
