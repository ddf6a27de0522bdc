"""`kvstore master`, `kvstore node` and `kvstore tiers` as real processes on 127.0.0.1.

Metadata traffic goes straight to the master over gRPC, so the exact counters of
one (node, tier) are known: two committed puts, one evicted, two hits, one miss.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest

from kvstore.v1 import master_pb2, master_pb2_grpc

from .procs import run, service

pytestmark = pytest.mark.timeout(90)
KiB = 1 << 10


def _put(stub: master_pb2_grpc.MasterStub, key: str, size: int) -> None:
    item = master_pb2.PutStartItem(key=key, size=size)
    res = stub.PutStart(master_pb2.PutStartRequest(client_id="t", items=[item]), timeout=5)
    assert res.results[0].status.code == 0
    end = stub.PutEnd(master_pb2.PutEndRequest(client_id="t", keys=[key]), timeout=5)
    assert end.results[0].code == 0


def _workload(address: str, offload: bool = True) -> None:
    """300 KiB k0, then k1 (both in DRAM): DRAM is past its 0.5 high watermark, so the
    colder k0 moves to the node's SSD (an offload, not an eviction), and k1 alone is
    under the 0.35 low one. (With a high watermark under one object, k0 alone was
    offloaded whenever the node moved it before k1 came, and k1 after it: 2 offloads.)"""
    with grpc.insecure_channel(address) as ch:
        stub = master_pb2_grpc.MasterStub(ch)
        _put(stub, "k0", 300 * KiB)
        _put(stub, "k1", 300 * KiB)
        for _ in range(500 if offload else 0):  # bounded: the node moves in the background
            stats = stub.Stats(master_pb2.StatsRequest(), timeout=5)
            if stats.offloads == 1 and stats.moves_in_flight == 0:
                break
            time.sleep(0.02)  # polling another process's counters
        if offload:
            assert (stats.offloads, stats.moves_in_flight) == (1, 0)
        look = stub.BatchLookup(master_pb2.BatchLookupRequest(keys=["k1", "k1", "nope"]))
        assert [r.status.code != 0 for r in look.results] == [False, False, True]


def test_master_node_tiers(tmp_path: Path) -> None:
    master_args = ["--high-watermark", "0.5", "--low-watermark", "0.35"]
    with service("master", "--listen", "127.0.0.1:0", *master_args) as (_, ready):
        assert ready.startswith("kvstore master listening on 127.0.0.1:")
        address = ready.split()[4]
        node_args = ["--master", address, "--listen", "127.0.0.1:0", "--node-id", "n1"]
        ssd = ["--ssd-dir", str(tmp_path), "--ssd-mib", "4"]
        with service("node", *node_args, "--dram-mib", "1", *ssd) as (_, node_ready):
            assert node_ready.startswith("kvstore node n1 ready on 127.0.0.1:")
            _workload(address)
            doc = json.loads(run("tiers", "--master", address, "--json").stdout)
            table = run("tiers", "--master", address)
    assert doc["master"] == address and [n["node_id"] for n in doc["nodes"]] == ["n1"]
    dram, ssd_row = doc["tiers"]
    assert (dram["node_id"], dram["tier"], ssd_row["tier"]) == ("n1", "DRAM", "SSD")
    assert (dram["capacity"], ssd_row["capacity"]) == (1 << 20, 4 << 20)
    assert (dram["used"], dram["objects"], dram["evictions"]) == (300 * KiB, 1, 0)
    assert (dram["hits"], dram["bytes_in"], dram["bytes_out"]) == (2, 600 * KiB, 600 * KiB)
    assert dram["hit_ratio"] == pytest.approx(2 / 3)
    assert (ssd_row["used"], ssd_row["objects"], ssd_row["evictions"]) == (300 * KiB, 1, 0)
    pool = doc["pool"]
    assert (pool["hits"], pool["misses"], pool["evictions"], pool["objects"]) == (2, 1, 0, 2)
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["node", "tier", "capacity", "used"]
    assert lines[2].split() == [
        "n1", "DRAM", "1.0", "MiB", "300.0", "KiB", "29.3", "1", "2", "66.7", "0", "600.0",
        "KiB", "600.0", "KiB",
    ]  # fmt: skip
    assert lines[3].split()[:2] == ["n1", "SSD"]
    assert lines[-1] == "lookups: 2 hits, 1 misses; 0 puts in flight"


def test_tiers_without_master_fails_cleanly() -> None:
    res = run("tiers", "--master", "127.0.0.1:1", "--timeout-s", "1")
    assert res.returncode == 4  # cli/errors.py: unavailable
    assert res.stderr.strip() == (
        "kvstore tiers: master 127.0.0.1:1 unavailable (UNAVAILABLE, deadline 1 s)"
    )


def test_bad_listen_address_is_rejected() -> None:
    res = run("node", "--master", "127.0.0.1:1", "--listen", "nohostport")
    assert res.returncode != 0 and "bad --listen 'nohostport'" in res.stderr


def test_node_with_missing_ssd_dir_is_one_line(tmp_path: Path) -> None:
    res = run(
        "node", "--master", "127.0.0.1:1", "--ssd-dir", str(tmp_path / "no"), "--ssd-mib", "1"
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert (
        res.stderr.strip() == f"kvstore node: --ssd-dir {str(tmp_path / 'no')!r} is not a directory"
    )


def test_master_port_in_use_is_one_line_unavailable() -> None:
    with service("master", "--listen", "127.0.0.1:0") as (_, ready):
        address = ready.split()[4]
        res = run("master", "--listen", address)
    assert res.returncode == 4 and "Traceback" not in res.stderr
    assert res.stderr.strip().startswith(f"kvstore master: cannot listen on '{address}' (in use?)")


def test_node_that_cannot_reach_its_master_is_one_line() -> None:
    res = run("node", "--master", "127.0.0.1:1", "--dram-mib", "1", timeout_s=60)
    assert res.returncode == 4, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_master_from_config_file_with_metrics(tmp_path: Path) -> None:
    cfg = tmp_path / "kvstore.toml"
    cfg.write_text('[master]\nlisten = "127.0.0.1:0"\nnode_ttl_s = 7.0\n')
    args = ("master", "--config", str(cfg), "--metrics-listen", "127.0.0.1:0")
    with service(*args) as (_, ready):
        words = ready.split()
        assert words[:4] == ["kvstore", "master", "listening", "on"] and words[7] == "metrics"
        import urllib.request

        with urllib.request.urlopen(f"http://{words[8]}/metrics", timeout=5) as resp:
            assert b"kvstore_pool_capacity_bytes" in resp.read()
    res = run("config", "show", "master", "--config", str(cfg), "--json")
    doc = json.loads(res.stdout)["master"]
    assert doc["node_ttl_s"] == {"value": 7.0, "source": f"{cfg}:3"}
    assert doc["put_timeout_s"]["source"] == "default"


def test_master_logs_one_line_per_event(tmp_path: Path) -> None:
    """node registered, segment mounted, segment unmounted, objects dropped: key=value lines."""
    import subprocess

    from .procs import REPO, env, kvstore_cmd, read_line

    log = tmp_path / "master.log"
    with open(log, "w") as err:
        master = subprocess.Popen(
            kvstore_cmd("master", "--listen", "127.0.0.1:0"), stdout=subprocess.PIPE,
            stderr=err, text=True, cwd=REPO, env=env(),
        )  # fmt: skip
    try:
        address = read_line(master, 30).split()[4]
        with service("node", "--master", address, "--node-id", "ev1", "--dram-mib", "1"):
            _workload(address, offload=False)  # k0 and k1, 300 KiB each (no SSD)
            res = run("evict", "k1", "--force", "--master", address)  # k1 is leased
            assert res.returncode == 0, res.stderr
    finally:
        master.send_signal(2)
        master.wait(10)
    lines = log.read_text().splitlines()
    assert any("event=node_registered node=ev1 " in line for line in lines), lines
    assert any("event=segment_mounted node=ev1 " in line and "tier=DRAM" in line for line in lines)
    assert any("event=objects_dropped count=1 reason=admin_evict" in line for line in lines)
    assert any("event=segment_unmounted node=ev1 " in line for line in lines)
    assert any("event=objects_dropped count=1 reason=segment_unmounted" in line for line in lines)
