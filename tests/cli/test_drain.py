"""`kvstore drain` as a subprocess against a real pool of two storage node processes:
objects held only on the drained node move to the other one (same bytes), its segments
are unmounted; draining the last node is refused (exit 5, nothing changed) unless
--force, which says what is lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstore.client import Client
from kvstore.errors import NotFoundError

from .procs import run, service
from .test_admin import _wait_nodes

pytestmark = pytest.mark.timeout(180)
KiB = 1 << 10


def _cli(master: str, *args: str) -> tuple[int, str, str]:
    res = run(*args, "--master", master, timeout_s=60)
    return res.returncode, res.stdout, res.stderr


def _holders(master: str) -> dict[str, set[str]]:
    code, out, err = _cli(master, "ls", "--all", "--json")
    assert code == 0, err
    return {o["key"]: {r["node_id"] for r in o["replicas"]} for o in json.loads(out)["objects"]}


def _value(i: int) -> bytes:
    return bytes([i % 251]) * (50 * KiB + i)


def test_drain_moves_objects_then_refuses_the_last_node(tmp_path: Path) -> None:
    with service("master", "--listen", "127.0.0.1:0") as (_, ready):
        master = ready.split()[4]
        node = ["--master", master, "--listen", "127.0.0.1:0", "--dram-mib", "2"]
        with (
            service("node", *node, "--node-id", "na", "--ssd-dir", str(tmp_path), "--ssd-mib", "1"),
            service("node", *node, "--node-id", "nb"),
        ):
            _wait_nodes(master, 2)
            keys = [f"d/{i}" for i in range(8)]
            with Client(master, timeout_s=10) as c:
                for i, k in enumerate(keys):
                    c.put(k, _value(i))
            before = _holders(master)
            on_a = sorted(k for k, nodes in before.items() if nodes == {"na"})
            assert on_a, before  # the most-free placement put some on na

            code, out, err = _cli(master, "drain", "na", "--json")
            assert code == 0, err
            doc = json.loads(out)
            assert doc["moved"] == len(on_a) and doc["lost"] == []
            unmounted = sorted(doc["segments_unmounted"])
            assert len(unmounted) == 2 and "dram" in unmounted[0] and "ssd" in unmounted[1]
            after = _holders(master)
            assert set(after) == set(keys) and all(n == {"nb"} for n in after.values())
            with Client(master, timeout_s=10) as c:
                assert [c.get(k) for k in keys] == [_value(i) for i in range(len(keys))]
            nodes = {n["node_id"]: n for n in json.loads(_cli(master, "nodes", "--json")[1])}
            assert nodes["na"]["segments"] == [] and nodes["nb"]["objects"] == len(keys)

            code, out, err = _cli(master, "drain", "nb")
            assert code == 5 and out == "" and len(err.strip().splitlines()) == 1
            assert err.startswith(f"kvstore drain: refused: nb holds the only replica of "
                                  f"{len(keys)} objects")  # fmt: skip
            assert "--force drains anyway and loses them" in err
            assert _holders(master) == after  # refused: nothing changed
            with Client(master, timeout_s=10) as c:
                c.put("d/after-refusal", b"x" * 100)  # nb was uncordoned again
                assert _holders(master)["d/after-refusal"] == {"nb"}

            code, out, err = _cli(master, "drain", "nb", "--force")
            assert code == 0, err
            assert f"LOST (--force) {len(keys) + 1} objects" in out
            assert _holders(master) == {}
            with Client(master, timeout_s=10) as c, pytest.raises(NotFoundError):
                c.get(keys[0])


def test_drain_unknown_node_is_not_found() -> None:
    with service("master", "--listen", "127.0.0.1:0") as (_, ready):
        master = ready.split()[4]
        code, _, err = _cli(master, "drain", "ghost")
    assert code == 3 and err.strip() == "kvstore drain: unknown node 'ghost': register first"
