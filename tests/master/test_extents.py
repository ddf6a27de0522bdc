"""Extent leases in the master core (kvstore.master.extents), on a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.errors import BadRequestError, ExistsError, NoSpaceError, NotFoundError
from kvstore.master.extents import CommitItem
from kvstore.master.journal import RocksJournal
from kvstore.master.metadata import MasterState
from kvstore.master.model import Endpoint, ObjectState, PutItem
from kvstore.types import ObjectKey, Tier

from .conftest import FakeClock, make_state

SEG = 64 << 10  # a 64 KiB DRAM segment: extents are at most a 16th of it (4 KiB)


def pool(clock: FakeClock) -> MasterState:
    st = make_state(clock, extent_ttl_s=10.0)
    st.register_node("a", Endpoint("a:1", "h"), "inc1")
    st.mount_segment("a", "a-dram", Tier.DRAM, SEG)
    st.mount_segment("a", "a-ssd", Tier.SSD, SEG)
    return st


def test_commit_carves_objects_out_of_the_extent(clock: FakeClock) -> None:
    st = pool(clock)
    ext = st.grant_extent("w", "a", 1 << 20, 1000)
    assert (ext.node_id, ext.segment, ext.size) == ("a", "a-dram", SEG // 16)  # capped
    assert st.registry.segments[("a", "a-dram")].used == SEG // 16
    st.check_integrity()
    base = ext.start
    items = [CommitItem("k1", base + 1024, 100, 7), CommitItem("k0", base, 1000, 8)]
    assert st.commit_extent("w", ext.extent_id, items) == [None, None]
    st.check_integrity()  # every object is an allocation of its own; the rest stays leased
    k1 = st.objects["k1"]
    assert k1.state is ObjectState.COMPLETE and k1.checksum == 7
    assert (k1.replicas[0].offset, k1.replicas[0].length) == (base + 1024, 100)
    assert st.peek(["k0"])[0].replicas[0].offset == base  # visible like any put
    # k0 (1000 bytes, 1024 aligned) and k1 abut: only the tail remains leased
    assert sorted(ext.pieces.items()) == [(base + 1024 + 128, SEG // 16 - 1024 - 128)]
    assert st.remove(["k0"]) == [None]  # an object carved from an extent frees alone
    st.check_integrity()
    st.commit_extent("w", ext.extent_id, [], release=True)
    assert st.registry.segments[("a", "a-dram")].used == 128  # k1 alone remains
    st.check_integrity()


def test_bad_commits_change_nothing(clock: FakeClock) -> None:
    st = pool(clock)
    ext = st.grant_extent("w", "a", 4096, 4096)
    st.commit_extent("w", ext.extent_id, [CommitItem("k", ext.start, 64)])
    used = st.registry.segments[("a", "a-dram")].used
    res = st.commit_extent(
        "w", ext.extent_id,
        [
            CommitItem("k", ext.start + 64, 64),  # the key exists
            CommitItem("x", ext.start, 64),  # already committed range
            CommitItem("y", ext.start + 4096, 64),  # outside the extent
            CommitItem("z", ext.start + 65, 64),  # unaligned
            CommitItem("", ext.start + 128, 64),  # a bad key
        ],
    )  # fmt: skip
    assert isinstance(res[0], ExistsError)
    assert all(isinstance(r, BadRequestError) for r in res[1:])
    assert st.registry.segments[("a", "a-dram")].used == used and set(st.objects) == {"k"}
    st.check_integrity()
    with pytest.raises(NotFoundError):  # another client cannot commit into it
        st.commit_extent("intruder", ext.extent_id, [CommitItem("i", ext.start + 64, 64)])
    with pytest.raises(BadRequestError):
        st.grant_extent("w", "a", 10, 100)  # min above size


def test_expired_lease_frees_the_uncommitted_rest(clock: FakeClock) -> None:
    st = pool(clock)
    ext = st.grant_extent("w", "a", 4096, 4096)
    st.commit_extent("w", ext.extent_id, [CommitItem("kept", ext.start, 64)])
    clock.advance(9.0)
    st.commit_extent("w", ext.extent_id, [])  # a commit renews the lease
    st.heartbeat("a")
    clock.advance(9.0)
    st.heartbeat("a")
    st.tick()
    assert ext.extent_id in st.extents.live
    clock.advance(2.0)
    st.tick()  # 11 s since the last commit: gone, its uncommitted space freed
    assert ext.extent_id not in st.extents.live and st.extents.expired == 1
    assert st.registry.segments[("a", "a-dram")].used == 64
    with pytest.raises(NotFoundError):  # the writer falls back to PutStart
        st.commit_extent("w", ext.extent_id, [CommitItem("late", ext.start + 64, 64)])
    assert "late" not in st.objects
    st.check_integrity()


def test_release_on_grant_unmount_and_no_space(clock: FakeClock) -> None:
    st = pool(clock)
    first = st.grant_extent("w", "a", 4096, 4096)
    second = st.grant_extent("w", "a", 4096, 4096, release=first.extent_id)
    assert set(st.extents.live) == {second.extent_id}
    assert st.registry.segments[("a", "a-dram")].used == 4096
    st.check_integrity()
    st.unmount_segment("a", "a-dram")
    assert not st.extents.live
    st.check_integrity()
    with pytest.raises(NoSpaceError):  # only SSD is left: extents live in DRAM only
        st.grant_extent("w", "a", 4096, 4096)


def test_a_next_extent_goes_only_in_the_current_extents_segment(clock: FakeClock) -> None:
    """grant_extent(after=...) (CommitExtent's next_size): in the segment of the client's
    extent `after` or nowhere, even where a put would now prefer another segment; not
    after an extent that is not live, or is another client's."""
    st = pool(clock)
    st.register_node("b", Endpoint("b:1", "h"), "inc1")
    st.mount_segment("b", "b-dram", Tier.DRAM, 4 * SEG)  # more free bytes: ranked first
    cur = st.grant_extent("w", "a", 4096, 4096)
    assert cur.node_id == "a"  # the writer's own node first
    nxt = st.grant_extent("w", "x", 4096, 4096, after=cur.extent_id)  # "x": no node of its own
    assert (nxt.node_id, nxt.segment) == ("a", "a-dram")  # not b, where a put would go now
    assert st.grant_extent("w", "x", 4096, 4096).node_id == "b"
    while st.registry.segments[("a", "a-dram")].allocator.largest_free() >= 4096:
        st.grant_extent("w", "a", 4096, 4096)
    with pytest.raises(NoSpaceError):  # a-dram is full: no next extent, nowhere else
        st.grant_extent("w", "a", 4096, 4096, after=cur.extent_id)
    with pytest.raises(NoSpaceError):  # not this client's
        st.grant_extent("v", "a", 4096, 4096, after=cur.extent_id)
    st.commit_extent("w", cur.extent_id, [], release=True)
    with pytest.raises(NoSpaceError):  # no longer live
        st.grant_extent("w", "a", 4096, 4096, after=cur.extent_id)
    st.check_integrity()


def test_a_restarted_master_keeps_extents_and_puts_in_flight(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Bug 4 (docs/reliability.md): space a client may still be writing into (an extent
    lease, a put between PutStart and PutEnd) is journaled, and a successor restoring
    the journal neither hands it to another writer nor loses the writer's commit."""
    db = str(tmp_path / "db")

    def master() -> MasterState:
        return make_state(clock, RocksJournal(db), extent_ttl_s=10.0)

    st = master()
    st.register_node("a", Endpoint("a:1", "h"), "inc1")
    st.mount_segment("a", "a-dram", Tier.DRAM, SEG)
    ext = st.grant_extent("w", "a", 4096, 4096)
    gone = st.grant_extent("v", "a", 4096, 4096)
    st.commit_extent("v", gone.extent_id, [], release=True)  # ended: its record goes
    assert st.commit_extent("w", ext.extent_id, [CommitItem("k0", ext.start + 1024, 100)]) == [None]
    pieces = sorted(ext.pieces.items())  # the rest, before and after k0
    assert isinstance(st.put_start("p", "a", [PutItem(ObjectKey("p"), 500)])[0], list)
    assert isinstance(st.put_start("q", "a", [PutItem(ObjectKey("q"), 500)])[0], list)
    writing = {k: st.objects[k].replicas for k in ("p", "q")}
    st.journal.close()

    again = master()
    assert again.restore() == 3
    again.check_integrity()  # objects + restored extent pieces == allocator usage
    back = again.extents.live[ext.extent_id]
    assert list(again.extents.live) == [ext.extent_id]
    assert (back.client_id, back.start, sorted(back.pieces.items())) == ("w", ext.start, pieces)
    assert {k: again.objects[k].state for k in writing} == dict.fromkeys(
        writing, ObjectState.WRITING
    )
    assert {k: again.objects[k].replicas for k in writing} == writing
    # a fresh placement lands outside everything a writer may still write into
    fresh = again.put_start("x", "a", [PutItem(ObjectKey("x"), 4096)])[0]
    assert isinstance(fresh, list)
    held = [(ext.start, ext.start + ext.size)] + [
        (r.offset, r.offset + r.length) for locs in writing.values() for r in locs
    ]
    assert all(fresh[0].offset >= hi or fresh[0].offset + 4096 <= lo for lo, hi in held)
    # the writers finish what they started before the restart
    assert again.put_end("p", ["p"]) == [None]
    assert again.commit_extent("w", ext.extent_id, [CommitItem("k1", ext.start, 100)]) == [None]
    assert again.grant_extent("v", "a", 4096, 4096).extent_id > ext.extent_id
    again.check_integrity()
    clock.advance(31)  # past put_timeout_s from the restore: "q" was never committed
    again.heartbeat("a")
    again.tick()
    assert "q" not in again.objects and "x" not in again.objects
    again.check_integrity()
    again.journal.close()

    third = master()  # ended extents and reclaimed puts left the journal
    third.restore()
    assert sorted(third.objects) == ["k0", "k1", "p"]
    assert third.objects["p"].state is ObjectState.COMPLETE
    assert third.objects["k0"].writer == "w"  # (authz: only its writer removes it)
    assert third.put_end("p", ["p"]) == [None]  # a PutEnd retried across it: still ok
    assert third.journal.load().extents == [] and not third.extents.live  # both ran out
    third.check_integrity()
    third.journal.close()


def test_a_commit_retried_after_a_restart_is_answered_done(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A CommitExtent whose reply was lost in a failover is retried by the client: the
    successor answers it done (the same writer, place and checksum), even once the first
    try released the extent, and still refuses anything else for that key."""
    db = str(tmp_path / "db")
    st = make_state(clock, RocksJournal(db), extent_ttl_s=10.0)
    st.register_node("a", Endpoint("a:1", "h"), "inc1")
    st.mount_segment("a", "a-dram", Tier.DRAM, SEG)
    ext = st.grant_extent("w", "a", 4096, 4096)
    kept = st.grant_extent("w", "a", 4096, 4096)
    first = [CommitItem("k0", ext.start, 100, 7), CommitItem("k1", ext.start + 1024, 50, 8)]
    assert st.commit_extent("w", ext.extent_id, first, release=True) == [None, None]
    assert st.commit_extent("w", kept.extent_id, [CommitItem("k2", kept.start, 10, 9)]) == [None]
    st.journal.close()

    again = make_state(clock, RocksJournal(db), extent_ttl_s=10.0)
    again.restore()
    used = again.registry.segments[("a", "a-dram")].used
    assert again.commit_extent("w", ext.extent_id, first, release=True) == [None, None]
    assert again.commit_extent("w", kept.extent_id, [CommitItem("k2", kept.start, 10, 9)]) == [None]
    again.check_integrity()
    assert again.registry.segments[("a", "a-dram")].used == used  # nothing carved twice
    # not the same commit: other bytes, another place, another writer
    res = again.commit_extent(
        "w", kept.extent_id,
        [CommitItem("k2", kept.start, 10, 10), CommitItem("k0", kept.start + 1024, 100, 7)],
    )  # fmt: skip
    assert [type(e) for e in res] == [ExistsError, ExistsError]
    with pytest.raises(NotFoundError):  # a released extent: only a true retry is done
        again.commit_extent("w", ext.extent_id, [CommitItem("k0", ext.start, 100, 8)])
    with pytest.raises(NotFoundError):
        again.commit_extent("v", ext.extent_id, first)
    again.check_integrity()
    again.journal.close()
