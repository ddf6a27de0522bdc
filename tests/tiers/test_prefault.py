"""A peer's mapping of a shared segment is pre-faulted in the background
(kvstore.tiers.prefault): its pages end up resident in this process's mapping without
their bytes changing; close() stops it midway; where the kernel refuses the advice the
mapping is populated at once, as before."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvstore.tiers import prefault
from kvstore.tiers.shm import FdServer, SharedSegment, new_segment_name

MiB = 1 << 20
SIZE = 192 * MiB


@pytest.fixture
def owner() -> Iterator[SharedSegment]:
    server = FdServer()
    server.start()
    with SharedSegment.create(new_segment_name("test-prefault"), SIZE) as seg:
        seg.serve(server)
        arr = seg.numpy()
        arr[:: 4 * MiB] = np.arange(SIZE // (4 * MiB), dtype=np.uint8) + 1  # a mark per 4 MiB
        yield seg
    server.stop()


def resident_bytes(seg: SharedSegment) -> int:
    """Rss of this process's mapping of `seg` (found by its start address in smaps)."""
    start = int(seg.numpy().ctypes.data)
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        head = line.split(" ", 1)[0]
        if "-" in head and int(head.split("-")[0], 16) == start:
            for field in lines[i + 1 :]:
                if field.startswith("Rss:"):
                    return int(field.split()[1]) * 1024
    raise AssertionError("mapping not found in /proc/self/smaps")


def marks(seg: SharedSegment) -> list[int]:
    return seg.numpy()[:: 4 * MiB].tolist()


pytestmark = pytest.mark.skipif(not prefault.supported(), reason="no MADV_POPULATE_* here")


def test_a_peer_mapping_is_populated_in_the_background(owner: SharedSegment) -> None:
    with SharedSegment.attach(owner.name, owner.address, writable=True) as lazy:
        assert lazy.prefaulted is None
        assert resident_bytes(lazy) < SIZE // 20  # nothing touched, nothing mapped
    with SharedSegment.attach(owner.name, owner.address, writable=True, populate=True) as peer:
        assert peer.prefaulted is not None
        assert peer.prefaulted.wait(60)
        assert resident_bytes(peer) >= SIZE * 95 // 100
        assert marks(peer) == marks(owner) == list(range(1, SIZE // (4 * MiB) + 1))
    with SharedSegment.attach(owner.name, owner.address, populate=True) as reader:  # read-only
        assert reader.prefaulted is not None and reader.prefaulted.wait(60)
        assert resident_bytes(reader) >= SIZE * 95 // 100


def test_close_stops_it_and_leaves_no_thread(owner: SharedSegment) -> None:
    peer = SharedSegment.attach(owner.name, owner.address, writable=True, populate=True)
    done = peer.prefaulted
    assert done is not None
    peer.close()  # at once: most likely midway
    assert done.is_set()
    assert not [t for t in threading.enumerate() if t.name.startswith("kvstore-prefault")]
    assert marks(owner)[:3] == [1, 2, 3]


def test_without_the_advice_the_mapping_is_populated_at_once(
    owner: SharedSegment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prefault, "supported", lambda: False)
    with SharedSegment.attach(owner.name, owner.address, writable=True, populate=True) as peer:
        assert peer.prefaulted is None
        assert resident_bytes(peer) >= SIZE * 95 // 100  # MAP_POPULATE
