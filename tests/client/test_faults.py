"""Faults with real processes: killed nodes, leases vs eviction, killed writers, races.

Each test gets its own cluster (a master with a 1 s writer timeout and a 2 s node TTL).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from kvstore.client import Client
from kvstore.errors import NotFoundError, NotReadyError, TransferError
from tests.client.conftest import payload
from tests.cluster import REPO, Cluster, _read_line, child_env, stop_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

MASTER = {"put_timeout_s": 1.0}


@pytest.fixture
def pool(tmp_path) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    with Cluster(nodes=2, dram_bytes=1 << 20, master_options=MASTER, workdir=tmp_path) as c:
        yield c


def test_replica_survives_its_node_being_killed(pool: Cluster) -> None:
    value = payload(200_000, seed=11)
    with Client(pool.address, transport="tcp", timeout_s=3.0) as c:
        c.put("survivor", value, replicas=2)
        first, second = pool.holders("survivor")
        pool.kill_node(pool.node_index(first))  # the replica a reader tries first
        assert c.get("survivor") == value  # fails over to the live replica
        pool.wait_stats(lambda s: first not in [n.node_id for n in s.nodes])
        assert pool.holders("survivor") == [second]
        assert c.get("survivor") == value


def test_lost_only_replica_is_a_typed_error(pool: Cluster) -> None:
    with Client(pool.address, transport="tcp", timeout_s=2.0) as c:
        c.put("lonely", b"x" * 1000)
        (holder,) = pool.holders("lonely")
        pool.kill_node(pool.node_index(holder))
        start = time.monotonic()
        with pytest.raises(TransferError):
            c.get("lonely")  # the node is gone but not yet declared dead
        assert time.monotonic() - start < 5.0
        pool.wait_stats(lambda s: s.dead_nodes == 1)
        with pytest.raises(NotFoundError):
            c.get("lonely")  # declared dead: its replicas were dropped


def test_hung_peer_fails_within_the_timeout(pool: Cluster) -> None:
    # the reader is not the writer: a writer reads its own puts back from its location
    # cache first (kvstore.master.writerleases), which would add one timeout
    with (
        Client(pool.address, transport="tcp") as w,
        Client(pool.address, transport="tcp", timeout_s=1.0) as c,
    ):
        w.put("hung", b"y" * 100_000)
        (holder,) = pool.holders("hung")
        node = pool.node_procs[pool.node_index(holder)]
        node.proc.send_signal(signal.SIGSTOP)  # connected but silent
        try:
            start = time.monotonic()
            with pytest.raises(TransferError):
                c.get("hung")
            assert time.monotonic() - start < 4.0
        finally:
            node.proc.send_signal(signal.SIGCONT)


def test_lease_blocks_eviction(pool: Cluster) -> None:
    leased = payload(128 << 10, seed=1)
    with Client(pool.address) as w, Client(pool.address, lease_ttl_s=30.0) as c:
        w.put("leased", leased)  # a writer's own get would be served by its writer lease,
        w.put("plain", payload(128 << 10, seed=2))  # which does not hold against eviction
        assert c.get("leased") == leased  # lookup grants a 30 s lease
        for i in range(24):  # 3 MiB into a 2 MiB pool: eviction must run
            c.put(f"filler{i}", payload(128 << 10, seed=100 + i))
        stats = pool.stats()
        assert stats.evictions > 0 and not c.exists("plain")
        assert c.get("leased") == leased


def test_writer_killed_mid_put_leaves_nothing(pool: Cluster) -> None:
    before = pool.stats().used
    args = [sys.executable, "-m", "tests.client.writer_child", "hang", pool.address, "dying"]
    proc = subprocess.Popen(
        [*args, "300000", "7"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO, env=child_env(),
    )  # fmt: skip
    try:
        _read_line(proc, b"WRITTEN", 30.0)  # every replica written, PutEnd not sent
        mid = pool.stats()
        assert mid.writing == 1 and mid.used > before
        with Client(pool.address) as c:
            assert not c.exists("dying")
            proc.kill()
            proc.wait(5)
            with pytest.raises((NotReadyError, NotFoundError)):  # until reclaimed / after
                c.get("dying")
            after = pool.wait_stats(lambda s: s.writing == 0 and s.reclaimed_puts == 1)
            with pytest.raises(NotFoundError):
                c.get("dying")
            assert after.used == before and after.objects == mid.objects - 1
            c.put("dying", b"second life")
            assert c.get("dying") == b"second life"
    finally:
        stop_process(proc)


def test_concurrent_writers_one_wins(pool: Cluster) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.client.writer_child", "race", pool.address, "contested",
             "200000", str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO, env=child_env(),
        )
        for seed in range(1, 5)
    ]  # fmt: skip
    try:
        for p in procs:
            _read_line(p, b"READY", 30.0)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.flush()
        outcomes = [_read_line(p, b"", 30.0).strip() for p in procs]
        assert sorted(outcomes) == [b"EXISTS", b"EXISTS", b"EXISTS", b"OK"]
        winner = outcomes.index(b"OK") + 1
        with Client(pool.address) as c:
            assert c.get("contested") == bytes([winner]) * 200_000
        assert pool.stats().writing == 0
    finally:
        for p in procs:
            stop_process(p)
