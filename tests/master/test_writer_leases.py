"""Writer read leases in the master core (kvstore.master.writerleases), on a fake clock."""

from __future__ import annotations

import pytest

from kvstore.errors import BadRequestError, NotReadyError
from kvstore.master.batch import PutColumns
from kvstore.master.config import MasterConfig
from kvstore.master.extents import CommitItem
from kvstore.master.metadata import MasterState
from kvstore.master.model import Endpoint, PutItem
from kvstore.types import Tier

from .conftest import FakeClock, make_state

SEG = 64 << 10


def pool(clock: FakeClock, **overrides: object) -> MasterState:
    st = make_state(clock, extent_ttl_s=10.0, **overrides)
    st.register_node("a", Endpoint("a:1", "h"), "inc1")
    st.mount_segment("a", "a-dram", Tier.DRAM, SEG)
    return st


def commit(st: MasterState, client: str, keys: list[str], lease_s: float) -> list[object]:
    ext = st.grant_extent(client, "a", 4096, 1000)
    items = [CommitItem(k, ext.start + 128 * i, 100, 7 + i) for i, k in enumerate(keys)]
    return st.commit_extent(client, ext.extent_id, items, read_lease_s=lease_s)


def test_a_writer_lease_blocks_other_removes_not_the_writers(clock: FakeClock) -> None:
    st = pool(clock)
    assert commit(st, "w", ["k1", "k2"], 2.0) == [None, None]
    assert st.writer_leases.holder("k1", clock()) == "w"
    assert not st.objects["k1"].protected(clock())  # no read lease: still evictable
    (err,) = st.remove(["k1"], client_id="other")
    assert isinstance(err, NotReadyError) and "leased" in str(err)
    assert "k1" in st.objects  # refused: nothing changed
    assert st.remove(["k1"], force=True, client_id="other") == [None]  # an admin's force
    assert isinstance(st.put_start("other", "a", [PutItem("k1", 100)])[0], list)  # no tomb
    assert st.remove(["k2"], client_id="w") == [None]  # the writer's own remove too
    assert st.writer_leases.holder("k2", clock()) is None
    assert isinstance(st.put_start("other", "a", [PutItem("k2", 100)])[0], list)  # no tomb
    st.check_integrity()


def test_a_lease_ends_on_time_and_asks_are_capped(clock: FakeClock) -> None:
    st = pool(clock, writer_lease_ttl_s=1.5)
    assert st.writer_leases.ttl(10_000) == 1.5 and st.writer_leases.ttl(0) == 0.0
    assert commit(st, "w", ["k"], st.writer_leases.ttl(500)) == [None]
    clock.advance(0.6)
    assert st.writer_leases.holder("k", clock()) is None
    assert st.remove(["k"], client_id="other") == [None]
    assert commit(st, "w", ["plain"], 0.0) == [None]  # not asked: none granted
    assert st.writer_leases.holder("plain", clock()) is None
    st.tick()
    assert len(st.writer_leases) == 0  # swept
    st.check_integrity()


def test_an_evicted_writer_leased_key_is_a_tombstone_for_others(clock: FakeClock) -> None:
    st = pool(clock)
    assert commit(st, "w", ["k"], 2.0) == [None]
    st.evict_object(st.objects["k"])  # eviction is not held off by a writer lease
    assert "k" not in st.objects
    used = st.registry.segments[("a", "a-dram")].used
    with pytest.raises(NotReadyError, match="retry in"):  # its writer may still read it
        st.put_start_columns("other", "a", PutColumns.from_items([PutItem("k", 100)]))
    (err,) = commit(st, "other", ["k"], 0.0)  # and not through an extent either
    assert isinstance(err, NotReadyError)
    assert "k" not in st.objects
    assert st.registry.segments[("a", "a-dram")].used >= used
    assert isinstance(st.put_start("w", "a", [PutItem("k", 100)])[0], list)  # the writer may
    st.check_integrity()
    clock.advance(2.1)  # and once the lease ended, anyone may
    assert st.writer_leases.tombstone("k", "other", clock()) is None
    st.check_integrity()


def test_the_config_bounds_the_writer_lease() -> None:
    with pytest.raises(BadRequestError, match="writer_lease_ttl_s"):
        MasterConfig(writer_lease_ttl_s=-1)
    with pytest.raises(BadRequestError, match="writer_lease_ttl_s"):
        MasterConfig(writer_lease_ttl_s=61, max_lease_ttl_s=60)


def test_a_closing_writer_ends_its_leases_and_tombstones(clock: FakeClock) -> None:
    st = pool(clock)
    assert commit(st, "w", ["a", "b"], 2.0) == [None, None]
    assert commit(st, "v", ["c"], 2.0) == [None]
    st.evict_object(st.objects["b"])  # a tombstone of w's
    assert st.writer_leases.end_client("w") == 2  # a's lease, b's tombstone
    assert st.remove(["a"], client_id="other") == [None]
    assert isinstance(st.put_start("other", "a", [PutItem("b", 100)])[0], list)
    assert st.writer_leases.holder("c", clock()) == "v"  # another writer's stay
    st.check_integrity()


def test_cached_reads_count_under_a_lease_the_reporter_holds(clock: FakeClock) -> None:
    """Reads a client served from its location cache count (as hits) only for objects
    under a read lease, or under that client's own writer lease: never for a lease
    another client holds, a lease that ended, or an unknown key."""
    from kvstore.master import lookups

    st = pool(clock)
    assert commit(st, "w", ["k1", "k2"], 2.0) == [None, None]
    hits = st.counters.hits
    assert lookups.count_cached(st, ["k1"], [3], "w") == 3  # the writer's own lease
    assert lookups.count_cached(st, ["k1", "k2"], [3, 1], "other") == 0
    assert lookups.count_cached(st, ["k1", "nope"], [1, 1]) == 0  # no client: no writer
    st.lookup(["k2"], lease_ttl_s=1.0)  # a read lease: anyone's report of it counts
    assert lookups.count_cached(st, ["k2"], [2], "other") == 2
    assert st.counters.hits == hits + 1 + 5  # the lookup's own hit, then the reports
    clock.advance(2.5)  # both leases ended
    assert lookups.count_cached(st, ["k1", "k2"], [1, 1], "w") == 0
    st.check_integrity()
