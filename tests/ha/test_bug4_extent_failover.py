"""Bug 4 (docs/reliability.md), reproduced in process: after a failover the new leader
did not know the extents its predecessor granted, reallocated their free ranges, and a
client still inside its extent lease wrote its next put's bytes over an object the new
leader placed there (CorruptError on the other client's get). Extents, puts in flight
and COPY destinations are journaled now; this failed before."""

from __future__ import annotations

import time
from typing import Any

from kvstore.client import Client
from tests.ha.test_ha_inprocess import masters, wait_leader  # noqa: F401  (fixture)


def test_a_predecessors_extent_is_not_reallocated_under_its_holder(masters: Any) -> None:  # noqa: F811
    _, ms, store = masters
    old = wait_leader(ms)
    addresses = ",".join(m.address for m in ms)
    opts: dict[str, Any] = {"failover_timeout_s": 10}
    with (
        Client(addresses, segment_bytes=8 << 20, **opts) as lender,
        Client(addresses, **opts) as other,
    ):
        lender.put("a", b"a" * 1000)  # the lender's extent, granted by the old leader
        old.coord.cut = True
        new = wait_leader(ms, not_=old)
        assert new.state is not None and len(new.state.extents.live) == 1  # restored
        other.put("b", b"b" * 1000)  # placed by the new leader: not inside either extent
        lender.put("c", b"c" * 1000)  # the lender's next bump-allocated range
        assert lender.get("a") == b"a" * 1000
        assert other.get("b") == b"b" * 1000  # (CorruptError here before the fix)
        assert lender.get("c") == b"c" * 1000
        new.state.check_integrity()
    # the clients released their extents as they closed and the lender unmounted its
    # segment: no extent record and no object record is left behind in the journal
    deadline = time.monotonic() + 5

    def left() -> list[bytes]:
        return [k for k in list(store.data) if b"/m/x/" in k or b"/m/o/" in k]

    while left():
        assert time.monotonic() < deadline, left()
        time.sleep(0.01)
    assert any(b"/m/n/" in k for k in store.data)  # (the journal's key pattern)
