"""MatchPrefix per node and tier, ListObjects paging, stats, and restore from RocksDB."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kvstore.errors import BadRequestError
from kvstore.master import queries
from kvstore.master.config import MasterConfig
from kvstore.master.journal import RocksJournal
from kvstore.master.metadata import MasterState
from kvstore.master.model import Endpoint, PrefixMatch, PutItem
from kvstore.types import ObjectKey, Tier

from .conftest import FakeClock


def commit(st: MasterState, key: str, **kw: object) -> None:
    [res] = st.put_start("w", "", [PutItem(ObjectKey(key), 64, **kw)])  # type: ignore[arg-type]
    assert isinstance(res, list)
    assert st.put_end("w", [key]) == [None]


def test_match_prefix_per_node_and_tier(state: MasterState) -> None:
    commit(state, "h0", replicas=2)  # a DRAM + b DRAM
    commit(state, "h1", preferred_node="a", tier=Tier.SSD)
    commit(state, "h2", preferred_node="a", tier=Tier.SSD)
    commit(state, "h3", preferred_node="b")
    state.put_start("w", "", [PutItem(ObjectKey("h4"), 64)])  # WRITING: invisible
    res = queries.match_prefix(state, ["h0", "h1", "h2", "h3", "h4"])
    assert res.pool_length == 4
    assert res.matches == [PrefixMatch("a", Tier.DRAM, 1), PrefixMatch("b", Tier.DRAM, 1)]
    res = queries.match_prefix(state, ["h1", "h2", "h3"])
    assert res.pool_length == 3 and res.matches == [PrefixMatch("a", Tier.SSD, 2)]
    assert queries.match_prefix(state, ["zz", "h0"]).pool_length == 0
    assert queries.match_prefix(state, []).matches == []


def test_match_prefix_by_group(state: MasterState) -> None:
    for layer in range(3):
        commit(state, f"b0/L{layer}", group="b0", preferred_node="a", tier=Tier.DRAM)
    commit(state, "b1/L0", group="b1", preferred_node="a", tier=Tier.DRAM)
    state.put_start("w", "a", [PutItem(ObjectKey("b1/L1"), 64, group="b1")])  # one piece writing
    res = queries.match_prefix(state, ["b0", "b1"], by_group=True)
    assert res.pool_length == 1 and res.matches == [PrefixMatch("a", Tier.DRAM, 1)]
    assert state.put_end("w", ["b1/L1"]) == [None]
    res = queries.match_prefix(state, ["b0", "b1"], by_group=True)
    assert res.pool_length == 2 and res.matches == [PrefixMatch("a", Tier.DRAM, 2)]


def test_list_objects_paging(state: MasterState) -> None:
    for i in range(7):
        commit(state, f"obj{i}")
    commit(state, "other")
    keys, token = [], ""
    for _ in range(10):
        page, token = queries.list_objects(state, 3, token, prefix="obj")
        keys.append([o.key for o in page])
        if not token:
            break
    assert keys == [["obj0", "obj1", "obj2"], ["obj3", "obj4", "obj5"], ["obj6"]]
    with pytest.raises(BadRequestError):
        queries.list_objects(state, 0)


def test_stats_counts(state: MasterState) -> None:
    commit(state, "k")
    state.lookup(["k", "missing"])
    s = queries.stats(state)
    assert (s.objects, s.writing, s.capacity, s.used) == (1, 0, 14336, 64)
    assert (s.counters.hits, s.counters.misses) == (1, 1)
    assert [n.node_id for n in s.nodes] == ["a", "b"]


def test_segment_counters(state: MasterState, clock: FakeClock) -> None:
    commit(state, "two", replicas=2)  # a-dram first, b-dram second
    commit(state, "ssd", preferred_node="a", tier=Tier.SSD)
    state.put_start("w", "", [PutItem(ObjectKey("writing"), 64, preferred_node="b")])
    state.lookup(["two", "two", "ssd", "missing", "writing"])
    by_name = {r.name: r for r in queries.stats(state).segments}
    a, b, ssd = by_name["a-dram"], by_name["b-dram"], by_name["a-ssd"]
    assert (a.counters.hits, a.counters.bytes_out, a.counters.bytes_in) == (2, 128, 64)
    assert (b.counters.hits, b.counters.bytes_out, b.counters.bytes_in) == (0, 0, 64)
    assert (ssd.counters.hits, ssd.counters.bytes_out, ssd.objects) == (1, 64, 1)
    assert (b.replicas, b.objects) == (2, 1)  # "writing" is placed but not COMPLETE
    assert (state.counters.hits, state.counters.misses) == (3, 2)
    clock.advance(6)  # leases expire
    # No offload: every tier evicts on its own ("two" from both DRAM segments).
    state.config = replace(state.config, high_watermark=0.001, low_watermark=0.001, offload=False)
    assert state.evict_to_watermark() == 2  # "two" and "ssd"; "writing" is in flight
    by_name = {r.name: r for r in queries.stats(state).segments}
    assert [by_name[n].counters.evictions for n in ("a-dram", "a-ssd", "b-dram")] == [1, 1, 1]
    assert [by_name[n].objects for n in ("a-dram", "a-ssd", "b-dram")] == [0, 0, 0]
    state.check_integrity()


def test_restore_from_rocksdb_after_restart(tmp_path: Path, clock: FakeClock) -> None:
    cfg = MasterConfig(node_ttl_s=10, heartbeat_interval_s=1)
    db = str(tmp_path / "meta")
    first = MasterState(cfg, clock=clock, journal=RocksJournal(db))
    first.register_node("a", Endpoint("127.0.0.1:1", "h", "127.0.0.1:2", b"", "@kvstore-fd-a"))
    first.mount_segment("a", "seg", Tier.DRAM, 4096)
    commit(first, "kept", group="g")
    commit(first, "gone")
    first.put_start("w", "", [PutItem(ObjectKey("in-flight"), 64)])
    assert first.remove(["gone"]) == [None]
    kept = first.objects["kept"].replicas
    first.journal.close()

    second = MasterState(cfg, clock=clock, journal=RocksJournal(db))
    assert second.restore() == 2  # the put in flight too: its writer may still commit it
    found, _ = second.lookup(["kept", "gone", "in-flight"])
    assert getattr(found[0], "replicas", None) == kept
    assert [type(r).__name__ for r in found[1:]] == ["NotFoundError", "NotReadyError"]
    assert second.registry.nodes["a"].endpoint.rpc_address == "127.0.0.1:2"
    assert second.registry.nodes["a"].endpoint.shm_socket == "@kvstore-fd-a"
    [locs] = second.put_start("w", "", [PutItem(ObjectKey("new"), 64)])
    assert isinstance(locs, list) and locs[0].offset != kept[0].offset  # space is not reused
    second.check_integrity()
    clock.advance(11)  # the restored node never heart-beats again
    assert second.expire_nodes() == ["a"] and not second.objects
    second.journal.close()
