"""Extent leases in the master core (kvstore.master.extents), on a fake clock."""

from __future__ import annotations

import pytest

from kvstore.errors import BadRequestError, ExistsError, NoSpaceError, NotFoundError
from kvstore.master.extents import CommitItem
from kvstore.master.metadata import MasterState
from kvstore.master.model import Endpoint, ObjectState
from kvstore.types import Tier

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
