"""The master's tier moves, step by step, on a fake clock (no processes)."""

from __future__ import annotations

from pathlib import Path

from kvstore.errors import CorruptError, TransferError
from kvstore.master.journal import MetaJournal, RocksJournal
from kvstore.master.metadata import MasterState
from kvstore.master.model import Endpoint, PutItem
from kvstore.master.tiering import MoveKind, MoveResult, Purpose
from kvstore.types import ObjectKey, Tier

from .conftest import FakeClock, make_state


def pool(clock: FakeClock, journal: MetaJournal | None = None, **overrides: object) -> MasterState:
    """Node a: DRAM 1024 + SSD 4096; watermarks 0.5 / 0.25, 64-byte alignment."""
    st = make_state(clock, journal, **{"high_watermark": 0.5, "low_watermark": 0.25, **overrides})
    st.register_node("a", Endpoint("a:1", "h"), "inc1")
    st.mount_segment("a", "a-dram", Tier.DRAM, 1024)
    st.mount_segment("a", "a-ssd", Tier.SSD, 4096)
    return st


def put(st: MasterState, key: str, size: int = 256, **kw: object) -> None:
    [locs] = st.put_start("w", "a", [PutItem(ObjectKey(key), size, **kw)])  # type: ignore[arg-type]
    assert isinstance(locs, list), locs
    st.put_end("w", [key], [len(key)])


def tiers(st: MasterState, key: str) -> list[Tier]:
    return [r.tier for r in st.objects[key].replicas]


def test_offload_lists_the_copy_only_when_done_then_drops_dram(clock: FakeClock) -> None:
    st = pool(clock)
    put(st, "cold")
    put(st, "hot")
    put(st, "new")  # DRAM 768 / 1024 > 0.5: the coldest leave
    moves = st.tiering.take("a", 10)
    assert [(m.key, m.kind, m.purpose) for m in moves] == [
        ("cold", MoveKind.COPY, Purpose.OFFLOAD), ("hot", MoveKind.COPY, Purpose.OFFLOAD),
    ]  # fmt: skip
    assert tiers(st, "cold") == [Tier.DRAM]  # not listed before the node says so
    st.check_integrity()  # the SSD target ranges are reserved meanwhile
    st.complete_moves("a", [MoveResult(m.task_id) for m in moves])
    assert tiers(st, "cold") == [Tier.SSD] and tiers(st, "hot") == [Tier.SSD]
    assert st.counters.offloads == 2 and st.objects["new"].replicas[0].tier == Tier.DRAM
    st.check_integrity()


def test_failed_copy_keeps_the_dram_replica_and_frees_the_target(clock: FakeClock) -> None:
    st = pool(clock)
    for k in ("a1", "a2", "a3"):
        put(st, k)
    moves = st.tiering.take("a", 10)
    ssd = st.registry.segment("a", "a-ssd")
    assert ssd.used == 2 * 256
    st.complete_moves("a", [MoveResult(m.task_id, TransferError("disk gone")) for m in moves])
    assert all(tiers(st, k) == [Tier.DRAM] for k in ("a1", "a2", "a3"))
    assert ssd.used == 0 and st.counters.failed_moves == 2
    st.check_integrity()


def test_offload_target_segment_dies_mid_copy(clock: FakeClock) -> None:
    st = pool(clock)
    for k in ("b1", "b2", "b3"):
        put(st, k)
    st.tiering.take("a", 10)
    st.unmount_segment("a", "a-ssd")  # the SSD went away with copies in flight
    assert all(tiers(st, k) == [Tier.DRAM] for k in ("b1", "b2", "b3"))
    assert st.tiering.moves_in_flight() == 0
    st.check_integrity()


def test_object_removed_mid_copy_frees_its_target_when_the_node_reports(
    clock: FakeClock,
) -> None:
    st = pool(clock)
    for k in ("c1", "c2", "c3"):
        put(st, k)
    moves = st.tiering.take("a", 10)
    clock.advance(10)
    assert st.remove(["c1"]) == [None]
    st.check_integrity()  # c1's SSD target stays reserved: the node may still write it
    st.complete_moves("a", [MoveResult(m.task_id) for m in moves])
    assert "c1" not in st.objects and tiers(st, "c2") == [Tier.SSD]
    forgets = [m for m in st.tiering.take("a", 10) if m.kind is MoveKind.FORGET]
    assert [m.key for m in forgets] == ["c1"]  # the node indexed it: it must forget it
    st.check_integrity()


def test_corrupt_source_is_dropped_not_copied(clock: FakeClock) -> None:
    st = pool(clock)
    put(st, "d1", replicas=1)
    put(st, "d2")
    put(st, "d3")
    moves = st.tiering.take("a", 10)
    bad = next(m for m in moves if m.key == "d1")
    st.complete_moves("a", [MoveResult(bad.task_id, CorruptError("bytes differ"))])
    assert "d1" not in st.objects and st.counters.corrupt_replicas == 1
    st.check_integrity()


def test_promotion_after_two_slow_reads_and_skipped_when_dram_is_pinned(
    clock: FakeClock,
) -> None:
    st = pool(clock, high_watermark=1.0, low_watermark=1.0)
    put(st, "s", tier=Tier.SSD)
    [persist] = st.tiering.take("a", 10)
    st.complete_moves("a", [MoveResult(persist.task_id)])
    st.lookup(["s"])
    assert st.tiering.take("a", 10) == []
    st.lookup(["s"])
    [move] = st.tiering.take("a", 10)
    assert (move.purpose, move.src.tier, move.dst.tier) == (Purpose.PROMOTE, Tier.SSD, Tier.DRAM)
    st.complete_moves("a", [MoveResult(move.task_id)])
    assert tiers(st, "s") == [Tier.DRAM, Tier.SSD] and st.counters.promotions == 1
    # DRAM full of pinned objects: a due promotion is skipped and counted.
    for i in range(3):  # with "s", DRAM's 1024 bytes are all taken
        put(st, f"pin{i}", tier=Tier.DRAM, pin_ttl_s=100)
    put(st, "t", tier=Tier.SSD)
    assert [m.kind for m in st.tiering.take("a", 10)] == [MoveKind.PERSIST]
    st.lookup(["t"])
    st.lookup(["t"])
    assert st.tiering.take("a", 10) == [] and st.counters.promotions_skipped == 1
    st.check_integrity()


def test_put_end_persists_ssd_replicas_and_a_new_incarnation_voids_moves(
    clock: FakeClock,
) -> None:
    st = pool(clock)
    [locs] = st.put_start("w", "a", [PutItem(ObjectKey("p"), 100, tier=Tier.SSD)])
    res, waits = st.put_end_durable("w", ["p"], [77])
    assert res == [None] and list(waits) == [0]
    [persist] = st.tiering.take("a", 10)
    assert (persist.kind, persist.checksum, persist.dst) == (MoveKind.PERSIST, 77, locs[0])
    for k in ("e1", "e2", "e3"):
        put(st, k)
    assert st.tiering.moves_in_flight() == 3  # the PERSIST in hand + two offloads
    st.register_node("a", Endpoint("a:2", "h"), "inc2")  # the node restarted
    assert st.tiering.moves_in_flight() == 0
    assert st.registry.segment("a", "a-ssd").used == 128  # only "p" (aligned to 64)
    st.check_integrity()


def test_announce_adopts_refuses_and_drops(clock: FakeClock) -> None:
    st = pool(clock)
    put(st, "known", tier=Tier.SSD)
    put(st, "lost", tier=Tier.SSD)
    known = st.objects["known"].replicas[0]
    found = [
        ("known", known.offset, known.length, st.objects["known"].checksum),
        ("fresh", 2048, 300, 9),  # unknown to the master: adopted
        ("clash", known.offset, 64, 1),  # overlaps live data: refused
    ]
    adopted, seen, dropped, refused = st.announce("a", "a-ssd", found, complete=True)
    assert (adopted, seen, dropped, refused) == (1, 1, 1, ["clash"])
    assert sorted(st.objects) == ["fresh", "known"]  # "lost" was not on the node any more
    assert st.objects["fresh"].checksum == 9
    st.check_integrity()


def test_an_object_removed_while_its_node_restarts_stays_removed(clock: FakeClock) -> None:
    st = pool(clock)
    put(st, "gone", tier=Tier.SSD)
    put(st, "kept", tier=Tier.SSD)
    gone, kept = st.objects["gone"].replicas[0], st.objects["kept"].replicas[0]
    st.tiering.take("a", 10)  # the PERSISTs, handed out and done
    assert st.remove(["gone"]) == [None]  # its FORGET is queued for node a...
    st.register_node("a", Endpoint("a:2", "h"), "inc2")  # ...which restarts before it ran
    assert st.tiering.tombstones == {"a": {"gone"}}
    found = [  # the node's index still lists both
        ("gone", gone.offset, gone.length, len("gone")),
        ("kept", kept.offset, kept.length, len("kept")),
    ]
    adopted, seen, dropped, refused = st.announce("a", "a-ssd", found, complete=True)
    assert (adopted, seen, dropped, refused) == (0, 1, 0, ["gone"])  # the node forgets it
    assert sorted(st.objects) == ["kept"] and not st.tiering.tombstones
    st.check_integrity()
    # a key put again after the grave was dug is the new object, not a ghost
    put(st, "gone", tier=Tier.SSD)
    assert st.objects["gone"].state.name == "COMPLETE"
    st.check_integrity()


def test_a_successor_holds_the_copies_a_node_was_handed(tmp_path: Path, clock: FakeClock) -> None:
    """Bug 4 (docs/reliability.md), for tier moves: a COPY handed to a node is journaled,
    so a restarted master keeps its destination out of new placements until the node
    reports it (or polls without it); its own task ids never collide with the old ones."""
    db = str(tmp_path / "db")
    st = pool(clock, journal=RocksJournal(db))
    for k in ("cold", "hot", "new"):
        put(st, k)
    old = st.tiering.take("a", 10)
    assert [m.key for m in old] == ["cold", "hot"]
    held = sorted((m.dst.offset, m.dst.length) for m in old)
    st.journal.close()

    again = pool(clock, journal=RocksJournal(db))
    again.restore()
    again.check_integrity()  # the held destinations count as the allocator's usage
    ssd = again.registry.segment("a", "a-ssd")
    assert ssd.used == 512 and again.tiering.orphans == {"a": {m.task_id for m in old}}
    again.evict_to_watermark()  # DRAM is still past its watermark: offload anew
    fresh = again.tiering.take("a", 10)
    assert sorted(m.key for m in fresh) == ["cold", "hot"]
    assert min(m.task_id for m in fresh) > max(m.task_id for m in old)
    for m in fresh:  # never into a range the node may still be copying into
        assert all(m.dst.offset >= o + n or m.dst.offset + m.dst.length <= o for o, n in held)
    # the node reports one old COPY (done) and not the other: both ranges are freed, and
    # the one it wrote into its index is forgotten there; the stale id is no new move's
    again.complete_moves("a", [MoveResult(old[0].task_id)])
    assert ssd.used == 512 and not again.tiering.orphans  # only the fresh copies' ranges
    forgets = again.tiering.take("a", 10)
    assert [(m.kind, m.dst.offset) for m in forgets] == [(MoveKind.FORGET, old[0].dst.offset)]
    assert tiers(again, "cold") == [Tier.DRAM]  # the fresh copy is not done yet
    again.complete_moves("a", [MoveResult(m.task_id) for m in fresh])
    assert tiers(again, "cold") == [Tier.SSD] and tiers(again, "hot") == [Tier.SSD]
    again.check_integrity()
    assert again.journal.load().moves == []  # every COPY ended: no record is left
    again.journal.close()
