"""The location cache serving SSD replicas, with real processes: a repeated get of an
SSD object makes no master call; the reads it served still count towards promotion
(reported with the next lookup, and the read that makes it due goes to the master);
an overwritten cached SSD range is detected, never served; a cached read that fails
drops its entry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstore.client import Client
from kvstore.client.steps import Rpc
from kvstore.errors import CorruptError, KVStoreError
from kvstore.types import Tier
from kvstore.v1 import master_pb2
from tests.client.test_extents_cache import overwrite_cached
from tests.cluster import Cluster

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
SIZE = 256 << 10


def blob(i: int, size: int = SIZE) -> bytes:
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


def ssd_segment(stats: master_pb2.StatsResponse) -> master_pb2.SegmentStats:
    return next(g for g in stats.segments if g.tier == Tier.SSD)


def dram_segment(stats: master_pb2.StatsResponse) -> master_pb2.SegmentStats:
    return next(g for g in stats.segments if g.tier == Tier.DRAM)


class Calls:
    """Every master call a client's operations make: (method, request)."""

    def __init__(self, client: Client) -> None:
        self.seen: list[tuple[str, Any]] = []
        route = client._route

        def counted(step: Rpc) -> Any:
            self.seen.append((step.method, step.request))
            return route(step)

        client._route = counted  # type: ignore[method-assign]

    def methods(self) -> list[str]:
        return [m for m, _ in self.seen]

    def lookups(self) -> list[master_pb2.BatchLookupRequest]:
        return [r for m, r in self.seen if m == "BatchLookup"]


def pool(tmp_path: Path, promote_after: int, nodes: int = 1) -> Cluster:
    opts = {"high_watermark": 1.0, "low_watermark": 1.0, "promote_after": promote_after}
    return Cluster(
        nodes=nodes, dram_bytes=4 * MIB, ssd_bytes=16 * MIB, master_options=opts,
        workdir=tmp_path,
    )  # fmt: skip


@pytest.fixture
def no_promotion(tmp_path: Path) -> Iterator[Cluster]:
    with pool(tmp_path, promote_after=0) as c:
        yield c


def test_a_repeated_ssd_get_makes_no_master_call(no_promotion: Cluster) -> None:
    cluster = no_promotion
    with Client(cluster.address) as w, Client(cluster.address, timeout_s=5.0) as r:
        w.put("s", blob(1), tier=Tier.SSD)
        w.put("other", blob(2), tier=Tier.SSD)
        assert r.get("s") == blob(1)  # looked up: its SSD replica is cached
        entry = r._ctx.locations.get("s", ssd=True)
        assert entry is not None and entry.ssd and entry.replicas[0].tier == Tier.SSD
        assert r._ctx.locations.get("s") is None  # not for readers that do not count
        hits_before = ssd_segment(cluster.stats()).hits
        calls = Calls(r)
        out = bytearray(SIZE)
        for _ in range(5):
            assert r.get("s") == blob(1)
            out[:] = bytes(SIZE)
            assert r.get_into("s", out) == SIZE and out == blob(1)
        assert calls.methods() == []  # ten reads of the SSD object, no master call
        assert r._ctx.locations.ssd_hits == 10 and r._ctx.locations.unreported() == 10
        assert r._ctx.ssd_reads == 11  # the looked-up read and the ten cached ones
        assert ssd_segment(cluster.stats()).hits == hits_before  # not reported yet
        # The next lookup carries them; the master counts them as hits of the SSD tier.
        assert r.get("other") == blob(2)
        (sent,) = calls.lookups()
        assert list(sent.keys) == ["other"]
        assert list(sent.cached_keys) == ["s"] and list(sent.cached_reads) == [10]
        assert r._ctx.locations.unreported() == 0
        assert ssd_segment(cluster.stats()).hits == hits_before + 10 + 1


def test_cached_ssd_reads_still_promote(tmp_path: Path) -> None:
    """promote_after 3: the 1st read is a lookup, the 2nd is served from the cache, the
    3rd (the one that makes it due) is a lookup carrying the 2nd: promotion is queued
    on the 3rd read, as without the cache; once it is done the key reads from DRAM."""
    with pool(tmp_path, promote_after=3) as cluster, Client(cluster.address) as w, Client(
        cluster.address, timeout_s=5.0
    ) as r:  # fmt: skip
        w.put("hot", blob(7), tier=Tier.SSD)
        calls = Calls(r)
        assert r.get("hot") == blob(7)  # 1: looked up
        assert r.get("hot") == blob(7)  # 2: from the cache
        assert calls.methods() == ["BatchLookup"]
        assert cluster.stats().promotions == 0 and r._ctx.locations.promote_after == 3
        assert r.get("hot") == blob(7)  # 3: due: a lookup, with read 2 reported
        lookups = calls.lookups()
        assert len(lookups) == 2
        assert list(lookups[1].cached_keys) == ["hot"] and list(lookups[1].cached_reads) == [1]
        stats = cluster.wait_stats(lambda s: s.promotions >= 1 and s.moves_in_flight == 0, 20)
        assert dram_segment(stats).promotions_in == 1
        # The lookup that queued it saw the object moving and did not cache its SSD
        # replica: the next read looks it up and finds (and caches) the DRAM one.
        assert r._ctx.locations.get("hot", ssd=True) is None
        assert r.get("hot") == blob(7)
        entry = r._ctx.locations.get("hot")
        assert entry is not None and not entry.ssd and entry.replicas[0].tier == Tier.DRAM
        before = len(calls.lookups())
        assert r.get("hot") == blob(7) and len(calls.lookups()) == before  # DRAM, cached
        assert dram_segment(cluster.stats()).hits >= 1


def test_an_overwritten_cached_ssd_range_is_never_served(no_promotion: Cluster) -> None:
    cluster = no_promotion
    with Client(cluster.address) as w, Client(cluster.address, timeout_s=5.0) as r:
        w.put("victim", blob(3), tier=Tier.SSD)
        assert r.get("victim") == blob(3)
        assert r.get("victim") == blob(3) and r._ctx.locations.ssd_hits == 1
        overwrite_cached(r, "victim", b"\xff" * 4096, at=SIZE // 2, ssd=True)
        calls = Calls(r)
        with pytest.raises(CorruptError):  # cached read fails its check: looked up, and
            r.get("victim")  # the only replica fails it again: reported, never served
        assert r._ctx.locations.stale == 1 and r._ctx.locations.ssd_hits == 1
        assert r._ctx.locations.get("victim", ssd=True) is None
        assert calls.methods() == ["BatchLookup", "ReportCorrupt"]
        stats = cluster.stats()
        assert stats.corrupt_replicas == 1 and not r.exists("victim")
        # A range overwritten with the object's own bytes elsewhere cannot pass as
        # another object either: a second key, overwritten with the first one's bytes.
        w.put("a", blob(4), tier=Tier.SSD)
        w.put("b", blob(5), tier=Tier.SSD)
        assert r.get("b") == blob(5)
        overwrite_cached(r, "b", blob(4), ssd=True)
        with pytest.raises(CorruptError):
            r.get("b")
        assert r.get("a") == blob(4)


def test_a_failed_cached_ssd_read_drops_its_entry(tmp_path: Path) -> None:
    """Over TCP (the node serves the slab): its node killed, the cached read fails, its
    entry goes; the lookup that follows fails typed too (the node is not declared dead
    yet), and nothing is cached for the key."""
    with pool(tmp_path, promote_after=0) as cluster, Client(cluster.address) as w, Client(
        cluster.address, transport="tcp", timeout_s=2.0
    ) as r:  # fmt: skip
        w.put("gone", blob(6), tier=Tier.SSD)
        assert r.get("gone") == blob(6)
        assert r._ctx.locations.get("gone", ssd=True) is not None
        cluster.kill_node(0)
        calls = Calls(r)
        with pytest.raises(KVStoreError):
            r.get("gone")
        assert r._ctx.locations.stale == 1 and r._ctx.locations.ssd_hits == 0
        assert r._ctx.locations.get("gone", ssd=True) is None
        assert "BatchLookup" in calls.methods()


def test_a_writer_reads_its_ssd_put_back_with_no_lookup_and_still_promotes(
    tmp_path: Path,
) -> None:
    """The writer caches the SSD location its put wrote (under its writer lease): its
    first read makes no master call; that read is reported with the next lookup, which
    the master counts under the writer's own lease, so the second read (due, with
    promote_after 2) queues the promotion as a reader's would."""
    with pool(tmp_path, promote_after=2) as cluster, Client(cluster.address) as w:
        w.put("mine", blob(8), tier=Tier.SSD)
        entry = w._ctx.locations.get("mine", ssd=True)
        assert entry is not None and entry.ssd and entry.reads == 0
        calls = Calls(w)
        assert w.get("mine") == blob(8)  # 1: from the cache
        assert calls.methods() == [] and w._ctx.locations.ssd_hits == 1
        assert w._ctx.locations.promote_after == 2  # the PutEnd reply said it
        assert w.get("mine") == blob(8)  # 2: due: a lookup reporting read 1
        (sent,) = calls.lookups()
        assert list(sent.cached_keys) == ["mine"] and list(sent.cached_reads) == [1]
        stats = cluster.wait_stats(lambda s: s.promotions >= 1 and s.moves_in_flight == 0, 20)
        assert dram_segment(stats).promotions_in == 1
