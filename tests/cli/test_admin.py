"""Every admin command as a subprocess against a real local pool (master + two storage
nodes, `kvstore master` / `kvstore node` processes): exact outcomes, exit codes, and
one-line failures."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvstore.client import Client
from kvstore.errors import NotReadyError

from .procs import run, service

pytestmark = pytest.mark.timeout(180)
KiB = 1 << 10


@dataclass
class Pool:
    master: str

    def cli(self, *args: str, timeout_s: float = 60.0) -> tuple[int, str, str]:
        res = run(*args, "--master", self.master, timeout_s=timeout_s)
        return res.returncode, res.stdout, res.stderr

    def json(self, *args: str) -> object:
        code, out, err = self.cli(*args, "--json")
        assert code == 0, err
        return json.loads(out)


def _wait_nodes(address: str, n: int) -> None:
    with Client(address, timeout_s=5) as c:
        deadline = time.monotonic() + 30
        while len(c.stats()["nodes"]) < n:
            assert time.monotonic() < deadline, "nodes did not register"
            time.sleep(0.05)  # polling the master's own answer, bounded by the deadline


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    ssd = tmp_path_factory.mktemp("ssd")
    with service("master", "--listen", "127.0.0.1:0") as (_, ready):
        address = ready.split()[4]
        node = ["--master", address, "--listen", "127.0.0.1:0", "--dram-mib", "1"]
        with (
            service("node", *node, "--node-id", "na", "--ssd-dir", str(ssd), "--ssd-mib", "1"),
            service("node", *node, "--node-id", "nb"),
        ):
            _wait_nodes(address, 2)
            yield Pool(address)


def _put(pool: Pool, items: dict[str, int], **kw: object) -> None:
    with Client(pool.master, timeout_s=10) as c:
        for key, size in items.items():
            c.put(key, bytes([len(key) % 251]) * size, **kw)  # type: ignore[arg-type]


def test_status_nodes_and_tiers(pool: Pool) -> None:
    _put(pool, {"st/a": 10 * KiB})
    doc = pool.json("status")
    assert doc["nodes"] == 2 and doc["capacity"] == 3 << 20  # type: ignore[index]
    assert set(doc["tiers"]) == {"DRAM", "SSD"}  # type: ignore[index]
    code, out, _ = pool.cli("status")
    assert code == 0 and out.splitlines()[-1] == "health OK"
    nodes = pool.json("nodes")
    assert [n["node_id"] for n in nodes] == ["na", "nb"]  # type: ignore[union-attr,index]
    assert nodes[0]["capacity"] == 2 << 20 and nodes[1]["capacity"] == 1 << 20  # type: ignore[index]
    code, out, _ = pool.cli("tiers")
    assert code == 0 and out.splitlines()[0].split()[:2] == ["node", "tier"]


def test_ls_pages_and_inspect(pool: Pool) -> None:
    _put(pool, {f"ls/{i}": 1000 + i for i in range(5)})
    page = pool.json("ls", "ls/", "--limit", "2")
    assert [o["key"] for o in page["objects"]] == ["ls/0", "ls/1"]  # type: ignore[index]
    token = page["next_page_token"]  # type: ignore[index]
    every = pool.json("ls", "ls/", "--limit", "2", "--all")
    assert [o["size"] for o in every["objects"]] == [1000, 1001, 1002, 1003, 1004]  # type: ignore[index]
    rest = pool.json("ls", "ls/", "--limit", "10", "--page-token", token)
    assert [o["key"] for o in rest["objects"]] == ["ls/2", "ls/3", "ls/4"]  # type: ignore[index]
    code, out, _ = pool.cli("ls", "ls/", "--limit", "2")
    assert code == 0 and "more: kvstore ls ls/ --page-token ls/1" in out
    doc = pool.json("inspect", "ls/3")
    assert (doc["size"], doc["state"], len(doc["replicas"])) == (1003, "COMPLETE", 1)  # type: ignore[index]
    assert doc["writer"].startswith("client-") and doc["group_members"] == 1  # type: ignore[index]
    assert doc["hits"] == 0  # type: ignore[index]
    with Client(pool.master, timeout_s=10, location_cache_entries=0) as c:  # each get a lookup
        for _ in range(3):
            c.get("ls/3")
        c.batch_get([f"ls/{i}" for i in range(5)] * 4)  # a batch: >16 keys, the numpy path
    assert pool.json("inspect", "ls/3")["hits"] == 4  # type: ignore[index]
    code, out, err = pool.cli("inspect", "ls/nope")
    assert code == 3 and out == "" and err.strip() == "kvstore inspect: unknown key 'ls/nope'"


def test_pin_blocks_rm_until_unpin_and_rm_force(pool: Pool) -> None:
    _put(pool, {"pin/a": 100, "pin/b": 100})
    assert pool.cli("pin", "pin/a", "--ttl-s", "600")[0] == 0
    assert pool.json("inspect", "pin/a")["pin_ms_left"] > 500_000  # type: ignore[index]
    code, _, err = pool.cli("rm", "pin/a")
    assert code == 5 and "leased or pinned" in err and len(err.strip().splitlines()) == 1
    assert pool.cli("unpin", "pin/a")[0] == 0
    assert pool.json("inspect", "pin/a")["pin_ms_left"] == 0  # type: ignore[index]
    code, out, _ = pool.cli("rm", "pin/a")
    assert (code, out.strip()) == (0, "removed pin/a")
    assert pool.cli("pin", "pin/b")[0] == 0
    assert pool.cli("rm", "pin/b", "--force")[0] == 0
    assert pool.cli("inspect", "pin/b")[0] == 3
    code, _, err = pool.cli("rm", "pin/never")
    assert code == 3 and "unknown key 'pin/never'" in err


def test_evict_key_prefix_and_dry_run(pool: Pool) -> None:
    _put(pool, {"ev/x/1": 100, "ev/x/2": 100, "ev/y": 100})
    dry = pool.json("evict", "--prefix", "ev/x/", "--dry-run")
    assert (dry["evicted"], dry["keys"]) == (2, ["ev/x/1", "ev/x/2"])  # type: ignore[index]
    assert pool.cli("inspect", "ev/x/1")[0] == 0  # dry run changed nothing
    done = pool.json("evict", "--prefix", "ev/x/")
    assert done["evicted"] == 2 and done["freed_bytes"] == 200  # type: ignore[index]
    assert pool.cli("inspect", "ev/x/1")[0] == 3
    one = pool.json("evict", "ev/y", "ev/missing")
    assert (one["evicted"], one["missing"]) == (1, 1)  # type: ignore[index]
    code, _, err = pool.cli("evict")
    assert code == 2 and "exactly one of" in err
    code, _, err = pool.cli("evict", "--tier", "dram")
    assert code == 2 and "--tier and --watermark go together" in err
    code, _, err = pool.cli("evict", "--tier", "tape", "--watermark", "0.1")
    assert code == 2 and "unknown tier 'tape'" in err


def test_evict_tier_to_watermark(pool: Pool) -> None:
    _put(pool, {f"wm/{i}": 100 * KiB for i in range(6)}, tier=None)
    before = pool.json("status")["tiers"]["DRAM"]  # type: ignore[index]
    assert before["used"] >= 600 * KiB
    res = pool.json("evict", "--tier", "dram", "--watermark", "0.1")
    after = pool.json("status")["tiers"]["DRAM"]  # type: ignore[index]
    assert after["used"] <= 0.1 * after["capacity"] and res["evicted"] >= 4  # type: ignore[index]
    ours = [k for k in res["keys"] if k.startswith("wm/")]  # type: ignore[index]
    assert ours[:2] == ["wm/0", "wm/1"]  # least recently used first


def test_own_lease_does_not_block_own_remove(pool: Pool) -> None:
    _put(pool, {"own/k": 100})
    with Client(pool.master, timeout_s=5) as me, Client(pool.master, timeout_s=5) as other:
        assert me.get("own/k") == bytes([len("own/k") % 251]) * 100
        assert me.remove("own/k") is True  # my own lease: allowed
        _put(pool, {"own/k2": 100})
        other.get("own/k2")
        with pytest.raises(NotReadyError):
            me.remove("own/k2")  # someone else's lease still blocks


def test_master_down_is_one_line_and_unavailable_within_deadline() -> None:
    for cmd in (["status"], ["ls"], ["inspect", "k"], ["rm", "k"], ["evict", "k"],
                ["drain", "n"], ["nodes"], ["tiers"], ["pin", "k"], ["unpin", "k"]):  # fmt: skip
        started = time.monotonic()
        res = run(*cmd, "--master", "127.0.0.1:1", "--timeout-s", "1")
        took = time.monotonic() - started
        assert res.returncode == 4, (cmd, res.stderr)
        assert res.stderr.strip() == (
            f"kvstore {cmd[0]}: master 127.0.0.1:1 unavailable (UNAVAILABLE, deadline 1 s)"
        )
        assert "Traceback" not in res.stderr and took < 10, cmd


def test_debug_prints_the_traceback() -> None:
    res = run("status", "--master", "127.0.0.1:1", "--timeout-s", "1", "--debug")
    assert res.returncode == 4 and "Traceback" in res.stderr


def test_bad_flag_is_one_line_exit_2() -> None:
    res = run("ls", "--limit", "many")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "invalid int value: 'many'" in res.stderr


def test_config_file_names_the_master(pool: Pool, tmp_path: Path) -> None:
    cfg = tmp_path / "kvstore.toml"
    cfg.write_text(f'[cli]\nmaster = "{pool.master}"\n')
    res = run("status", "--json", "--config", str(cfg))
    assert res.returncode == 0 and json.loads(res.stdout)["master"] == pool.master
    cfg.write_text(f'[cli]\nmaster = "{pool.master}"\nmastr = 1\n')
    res = run("status", "--config", str(cfg))
    assert res.returncode == 2
    assert res.stderr.strip().startswith(f"kvstore status: {cfg}:3: unknown key 'mastr' in [cli]")


def test_refused_credentials_exit_5() -> None:
    from cli.errors import REFUSED, exit_code
    from kvstore.errors import PermissionDeniedError, UnauthenticatedError

    assert exit_code(PermissionDeniedError("not yours")) == REFUSED == 5
    assert exit_code(UnauthenticatedError("no credential")) == REFUSED
