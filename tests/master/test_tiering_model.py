"""The master's tier accounting under random operations (Hypothesis state machine).

Puts, commits, lookups (promotion), watermark passes (offload/eviction), node
reports of moves (done, failed, corrupt), removals, corrupt reports, node
restarts and announcements, in any order. After every step `check_integrity()`
holds (allocators hold exactly the replicas plus the reserved move targets) and:

- a committed object is never silently lost: it leaves only by remove, eviction,
  a corrupt drop, or the loss of its node's volatile segment;
- no object ever has two replicas on one node; a replica's tier is its segment's;
- a move's destination becomes a replica only after the node reports it done.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvstore.errors import CorruptError, KVStoreError, TransferError
from kvstore.master.config import MasterConfig
from kvstore.master.metadata import MasterState
from kvstore.master.model import Endpoint, ObjectState, PutItem
from kvstore.master.tiering import MoveKind, MoveResult
from kvstore.types import ObjectKey, Tier

KEYS = st.sampled_from([f"t{i % 2}/k{i}" if i % 3 else f"k{i}" for i in range(40)])
SIZES = st.sampled_from([64, 128, 256, 512])
NODES = ("a", "b")


class TieringMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        cfg = MasterConfig(
            high_watermark=0.6, low_watermark=0.3, default_alignment=64, promote_after=2,
            default_lease_ttl_s=1.0, tenant_quota_bytes=1 << 40,  # per-tenant usage counted
        )  # fmt: skip
        self.state = MasterState(cfg, clock=lambda: self.now)
        self.incarnations = dict.fromkeys(NODES, 0)
        for node in NODES:
            self._join(node)
        self.committed: set[str] = set()
        self.losses = 0  # objects that left by an allowed path

    def _join(self, node: str) -> None:
        st_ = self.state
        st_.register_node(node, Endpoint(f"{node}:1", "h"), f"{node}{self.incarnations[node]}")
        st_.mount_segment(node, f"{node}-dram-{self.incarnations[node]}", Tier.DRAM, 1024)
        st_.mount_segment(node, f"{node}-ssd", Tier.SSD, 4096)

    def _allowed_loss(self) -> None:
        gone = {k for k in self.committed if k not in self.state.objects}
        self.committed -= gone

    @rule(key=KEYS, size=SIZES, node=st.sampled_from(NODES), tier=st.sampled_from([None, 2]))
    def put(self, key: str, size: int, node: str, tier: int | None) -> None:
        item = PutItem(
            ObjectKey(key), size, preferred_node=node, tier=None if tier is None else Tier(tier)
        )
        [res] = self.state.put_start("w", node, [item])
        if isinstance(res, list):
            self.state.put_end("w", [key], [hash(key) & 0xFFFF or 1])
            self.committed.add(key)
        self._allowed_loss()

    @rule(key=KEYS, size=SIZES, node=st.sampled_from(NODES))
    def put_dram(self, key: str, size: int, node: str) -> None:
        self.put(key, size, node, None)  # puts dominate a cache's traffic

    @rule(key=KEYS)
    def lookup(self, key: str) -> None:
        self.state.lookup([key])

    @rule()
    def rebalance(self) -> None:
        self.state.evict_to_watermark()
        self._allowed_loss()

    @rule(seconds=st.floats(0.1, 3.0))
    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.state.tiering.drop_deferred()

    @rule(node=st.sampled_from(NODES), outcome=st.sampled_from(["ok", "fail", "corrupt"]))
    def node_reports(self, node: str, outcome: str) -> None:
        moves = self.state.tiering.take(node, 16)
        before = {m.task_id: m for m in moves}
        results = []
        for m in moves:
            err: KVStoreError | None = None
            if outcome == "fail":
                err = TransferError("injected")
            elif outcome == "corrupt" and m.kind is MoveKind.COPY:
                err = CorruptError("injected")
            results.append(MoveResult(m.task_id, err, m.checksum))
        self.state.complete_moves(node, results)
        for task_id, m in before.items():
            obj = self.state.objects.get(m.key)
            if m.kind is MoveKind.COPY and outcome != "ok" and obj is not None:
                assert all(
                    (r.segment, r.offset) != (m.dst.segment, m.dst.offset) for r in obj.replicas
                ), f"failed move {task_id} became a replica"
        self._allowed_loss()

    @rule(key=KEYS, force=st.booleans())
    def remove(self, key: str, force: bool) -> None:
        self.state.remove([key], force)
        self._allowed_loss()

    @rule(key=KEYS)
    def report_corrupt(self, key: str) -> None:
        obj = self.state.objects.get(key)
        if obj is not None and obj.state is ObjectState.COMPLETE:
            self.state.report_corrupt([(key, obj.replicas[-1])])
        self._allowed_loss()

    @rule(node=st.sampled_from(NODES), roll=st.integers(0, 7))
    def restart_node(self, node: str, roll: int) -> None:
        """A new incarnation: the DRAM segment is new (old one unmounted), the SSD is
        re-announced with what the master lists there (the node kept its index).
        Rarer than other steps (1 draw in 8), so moves get to finish between restarts."""
        if roll:
            return
        st_ = self.state
        ssd = st_.registry.segment(node, f"{node}-ssd")
        found = [
            (k, r.offset, r.length, st_.objects[k].checksum)
            for k in sorted(ssd.keys)
            for r in st_.objects[k].replicas
            if r.segment == ssd.name and st_.objects[k].state is ObjectState.COMPLETE
        ]
        st_.unmount_segment(node, f"{node}-dram-{self.incarnations[node]}")
        self.incarnations[node] += 1
        self._join(node)
        st_.announce(node, f"{node}-ssd", found, complete=True)
        for key, *_ in found:
            assert key in st_.objects, f"announced SSD object {key!r} was lost"
        self._allowed_loss()

    @invariant()
    def integrity(self) -> None:
        self.state.check_integrity()
        for key, obj in self.state.objects.items():
            for r in obj.replicas:
                seg = self.state.registry.segment(r.node_id, r.segment)
                assert seg.tier == r.tier, f"{key!r}: replica tier {r.tier} in a {seg.tier} segment"
        assert self.committed <= set(self.state.objects)


TieringMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_tiering_model = pytest.mark.filterwarnings("ignore")(TieringMachine.TestCase)
