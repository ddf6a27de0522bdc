"""SharedSegment: create/attach/close/unlink, name checks, and a real peer process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kvstore.errors import BadRequestError, ExistsError, NotFoundError
from kvstore.tiers.shm import SHM_DIR, SharedSegment, new_segment_name


@pytest.fixture
def segment() -> Iterator[SharedSegment]:
    with SharedSegment.create(new_segment_name("test-shm"), 1 << 16) as seg:
        yield seg


def test_create_write_attach_read(segment: SharedSegment) -> None:
    assert os.path.getsize(os.path.join(SHM_DIR, segment.name)) == 1 << 16
    segment.buffer[100:105] = b"hello"
    with SharedSegment.attach(segment.name) as peer:
        assert peer.size == segment.size and not peer.owner
        assert bytes(peer.buffer[100:105]) == b"hello"
        assert not peer.numpy().flags.writeable
        with pytest.raises(TypeError):
            peer.buffer[0:1] = b"x"
    assert os.path.exists(os.path.join(SHM_DIR, segment.name))  # a peer never unlinks


def test_writable_attach_and_numpy_share_memory(segment: SharedSegment) -> None:
    with SharedSegment.attach(segment.name, writable=True) as peer:
        peer.numpy()[:4] = [1, 2, 3, 4]
    assert bytes(segment.buffer[:4]) == b"\x01\x02\x03\x04"
    assert segment.numpy()[3] == 4


def test_owner_exit_unlinks_and_close_is_safe() -> None:
    name = new_segment_name("test-shm")
    with SharedSegment.create(name, 4096) as seg:
        held = seg.buffer[0:3]
        held[:] = b"abc"
    assert not os.path.exists(os.path.join(SHM_DIR, name))
    assert seg.closed
    assert bytes(held) == b"abc"  # a view held past close stays valid
    with pytest.raises(BadRequestError):
        _ = seg.buffer
    seg.close()
    seg.unlink()
    with pytest.raises(NotFoundError):
        SharedSegment.attach(name)


def test_create_existing_name_raises(segment: SharedSegment) -> None:
    with pytest.raises(ExistsError):
        SharedSegment.create(segment.name, 4096)


@pytest.mark.parametrize("name", ["", "a/b", "..", ".", "x\0y", "n" * 256, 7, None])
def test_bad_names(name: object) -> None:
    with pytest.raises(BadRequestError):
        SharedSegment.create(name, 4096)  # type: ignore[arg-type]
    with pytest.raises(BadRequestError):
        SharedSegment.attach(name)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [0, -1, 1.0, True])
def test_bad_sizes(size: object) -> None:
    name = new_segment_name("test-shm")
    with pytest.raises(BadRequestError):
        SharedSegment.create(name, size)  # type: ignore[arg-type]
    assert not os.path.exists(os.path.join(SHM_DIR, name))


def test_new_segment_names_are_unique() -> None:
    names = {new_segment_name() for _ in range(100)}
    assert len(names) == 100
    assert all(n.startswith("kvstore-") for n in names)


PEER = """
import sys
from kvstore.tiers.shm import SharedSegment
with SharedSegment.attach(sys.argv[1], writable=True) as seg:
    data = bytes(seg.buffer[int(sys.argv[2]):int(sys.argv[2]) + int(sys.argv[3])])
    seg.buffer[0:4] = b"pong"
sys.stdout.write(data.hex())
"""


def test_subprocess_reads_parent_bytes(segment: SharedSegment) -> None:
    payload = os.urandom(5000)
    segment.buffer[777 : 777 + len(payload)] = payload
    proc = subprocess.run(
        [sys.executable, "-c", PEER, segment.name, "777", str(len(payload))],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert bytes.fromhex(proc.stdout) == payload
    assert bytes(segment.buffer[0:4]) == b"pong"
    assert os.path.exists(os.path.join(SHM_DIR, segment.name))  # peer exit left it alone
