"""Fixtures of the master tests: a fake clock and a small two-node pool."""

from __future__ import annotations

import pytest

from kvstore.master.config import MasterConfig
from kvstore.master.journal import MetaJournal
from kvstore.master.metadata import MasterState
from kvstore.master.model import Endpoint
from kvstore.types import Tier


class FakeClock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_state(
    clock: FakeClock, journal: MetaJournal | None = None, **overrides: object
) -> MasterState:
    fields: dict[str, object] = {
        "node_ttl_s": 10, "heartbeat_interval_s": 1, "put_timeout_s": 30,
        "default_lease_ttl_s": 5, "high_watermark": 0.9, "low_watermark": 0.5,
        "default_alignment": 64,
    }  # fmt: skip
    cfg = MasterConfig(**{**fields, **overrides})  # type: ignore[arg-type]
    return MasterState(cfg, clock=clock, journal=journal)


@pytest.fixture
def state(clock: FakeClock) -> MasterState:
    """Nodes a (DRAM 4096 + SSD 8192) and b (DRAM 2048), 64-byte alignment."""
    return two_nodes(make_state(clock))


def two_nodes(st: MasterState) -> MasterState:
    """Mount the `state` fixture's pool on `st`."""
    for node in ("a", "b"):
        st.register_node(node, Endpoint(f"127.0.0.1:{9000 + ord(node)}", "host1"))
    st.mount_segment("a", "a-dram", Tier.DRAM, 4096)
    st.mount_segment("a", "a-ssd", Tier.SSD, 8192)
    st.mount_segment("b", "b-dram", Tier.DRAM, 2048)
    return st
