"""SharedSegment and FdServer: anonymous segments, attach by fd, real peer processes,
a killed owner leaves nothing, the server's robustness, reclaiming old /dev/shm files."""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.errors import (
    BadRequestError,
    NoSpaceError,
    NotFoundError,
    TransferError,
    UnavailableError,
)
from kvstore.tiers.shm import (
    FdServer,
    SharedSegment,
    available_memory,
    new_segment_name,
    process_fd_server,
    reclaim_stale_files,
)
from tests.memfd import holders, shm_files

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server() -> Iterator[FdServer]:
    srv = FdServer(timeout_s=30.0)  # long: a silent peer must not be what unblocks others
    srv.start()
    yield srv
    srv.check_integrity()
    srv.stop()


@pytest.fixture
def segment(server: FdServer) -> Iterator[SharedSegment]:
    with SharedSegment.create(new_segment_name("test-shm"), 1 << 16) as seg:
        seg.serve(server)
        yield seg


def test_create_is_anonymous_and_attach_by_fd_shares_memory(segment: SharedSegment) -> None:
    assert shm_files(segment.name) == []  # no file anywhere: nothing can outlive us
    assert holders(segment.name) == [os.getpid()]
    segment.buffer[100:105] = b"hello"
    with SharedSegment.attach(segment.name, segment.address) as peer:
        assert peer.size == segment.size and not peer.owner
        assert bytes(peer.buffer[100:105]) == b"hello"
        assert not peer.numpy().flags.writeable
        with pytest.raises(TypeError):
            peer.buffer[0:1] = b"x"
    with SharedSegment.attach(segment.name, segment.address, writable=True) as peer:
        peer.numpy()[:4] = [1, 2, 3, 4]
    assert bytes(segment.buffer[:4]) == b"\x01\x02\x03\x04"


def test_close_frees_the_fd_and_stops_serving(server: FdServer) -> None:
    name = new_segment_name("test-shm")
    with SharedSegment.create(name, 4096) as seg:
        address = seg.serve(server)
        assert seg.serve(server) == address  # idempotent
        held = seg.buffer[0:3]
        held[:] = b"abc"
    assert seg.closed and server.names() == []
    assert bytes(held) == b"abc"  # a view held past close stays valid ...
    assert holders(name) == [os.getpid()]
    del held  # ... and the last one unmaps (mmap's own fd goes with it): memory freed
    assert holders(name) == []  # no fd and no mapping of it left in this process
    with pytest.raises(BadRequestError):
        _ = seg.buffer
    seg.close()  # idempotent
    with pytest.raises(NotFoundError):
        SharedSegment.attach(name, address)
    with pytest.raises(BadRequestError):
        seg.serve(server)


def test_attach_errors_are_typed(segment: SharedSegment, server: FdServer) -> None:
    with pytest.raises(NotFoundError):
        SharedSegment.attach("test-shm-absent", server.address)
    with pytest.raises(UnavailableError):
        SharedSegment.attach(segment.name, "@kvstore-fd-nobody-listens")
    for bad in ["", "plain", "@", "@" + "x" * 200, "@a\0b", 7]:
        with pytest.raises(BadRequestError):
            SharedSegment.attach(segment.name, bad)  # type: ignore[arg-type]
    with pytest.raises(BadRequestError):
        FdServer(address="no-at-sign")


@pytest.mark.parametrize("name", ["", "a/b", "..", ".", "x\0y", "n" * 256, 7, None])
def test_bad_names(name: object, server: FdServer) -> None:
    with pytest.raises(BadRequestError):
        SharedSegment.create(name, 4096)  # type: ignore[arg-type]
    with pytest.raises(BadRequestError):
        SharedSegment.attach(name, server.address)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [0, -1, 1.0, True])
def test_bad_sizes(size: object) -> None:
    name = new_segment_name("test-shm")
    with pytest.raises(BadRequestError):
        SharedSegment.create(name, size)  # type: ignore[arg-type]
    assert holders(name) == []


def test_more_than_the_host_has_is_no_space_and_leaks_nothing() -> None:
    free = available_memory()
    assert free is not None and free > 0
    name = new_segment_name("test-shm")
    with pytest.raises(NoSpaceError):
        SharedSegment.create(name, 4 * free)
    assert holders(name) == []


def test_two_segments_one_server_and_names_are_unique(server: FdServer) -> None:
    with (
        SharedSegment.create("test-shm-a", 4096) as a,
        SharedSegment.create("test-shm-b", 8192) as b,
    ):
        a.serve(server)
        b.serve(server)
        assert sorted(server.names()) == ["test-shm-a", "test-shm-b"]
        with SharedSegment.attach("test-shm-b", server.address) as peer:
            assert peer.size == 8192
        with SharedSegment.create("test-shm-a", 4096) as again, pytest.raises(BadRequestError):
            again.serve(server)  # one name, one segment per server
    assert len({new_segment_name() for _ in range(100)}) == 100


def test_a_silent_peer_blocks_nobody(segment: SharedSegment, server: FdServer) -> None:
    silent = [socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(3)]
    try:
        for sock in silent:
            sock.connect("\0" + server.address[1:])
        with SharedSegment.attach(segment.name, server.address, timeout_s=5.0) as peer:
            assert peer.size == segment.size
    finally:
        for sock in silent:
            sock.close()


def test_an_overlong_name_is_refused_not_truncated(segment: SharedSegment) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(10)
        sock.connect("\0" + segment.address[1:])
        sock.sendall(segment.name.encode() + b"x" * 300)
        data, fds, _, _ = socket.recv_fds(sock, 2048, 1)
    assert data.startswith(b"NO") and b"too long" in data and fds == []


def test_connections_over_the_limit_are_refused_not_queued() -> None:
    srv = FdServer(timeout_s=30.0, max_connections=1)
    srv.start()
    try:
        seg = SharedSegment.create(new_segment_name("test-shm"), 4096)
        seg.serve(srv)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as silent:
            silent.connect("\0" + srv.address[1:])  # takes the one handler slot
            with pytest.raises(TransferError):  # closed unanswered at once, not after 30 s
                SharedSegment.attach(seg.name, srv.address, timeout_s=10.0)
            assert srv.refused == 1
        seg.close()
    finally:
        srv.stop()


def test_a_dropped_unclosed_segment_is_no_longer_served(server: FdServer) -> None:
    seg = SharedSegment.create(new_segment_name("test-shm"), 4096)
    name = seg.name
    seg.serve(server)
    del seg
    gc.collect()
    assert server.names() == [] and holders(name) == []  # fd closed by its finalizer
    with pytest.raises(NotFoundError):
        SharedSegment.attach(name, server.address)
    again = SharedSegment.create(name, 4096)  # the name is free again
    again.serve(server)
    server.check_integrity()
    again.close()


def test_stop_closes_the_socket_and_returns_with_a_silent_peer_connected() -> None:
    srv = FdServer(timeout_s=30.0)
    address = srv.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as silent:
        silent.connect("\0" + address[1:])
        done = threading.Event()
        stopper = threading.Thread(target=lambda: (srv.stop(), done.set()))
        stopper.start()
        assert done.wait(10), "stop() hung on the accept loop"
    with pytest.raises(UnavailableError):
        SharedSegment.attach("test-shm-x", address)
    srv.stop()  # idempotent


def test_process_server_serves_by_default() -> None:
    with SharedSegment.create(new_segment_name("test-shm"), 4096) as seg:
        assert seg.serve() == process_fd_server().address
        with SharedSegment.attach(seg.name, seg.address) as peer:
            assert peer.size == 4096


PEER = """
import sys
from kvstore.tiers.shm import SharedSegment
name, address, offset, length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with SharedSegment.attach(name, address, writable=True) as seg:
    data = bytes(seg.buffer[offset:offset + length])
    seg.buffer[0:4] = b"pong"
sys.stdout.write(data.hex())
"""


def test_subprocess_reads_and_writes_parent_bytes(segment: SharedSegment) -> None:
    payload = os.urandom(5000)
    segment.buffer[777 : 777 + len(payload)] = payload
    argv = [segment.name, segment.address, "777", str(len(payload))]
    proc = subprocess.run(
        [sys.executable, "-c", PEER, *argv], capture_output=True, text=True, timeout=60, check=True
    )
    assert bytes.fromhex(proc.stdout) == payload
    assert bytes(segment.buffer[0:4]) == b"pong"
    assert holders(segment.name) == [os.getpid()]  # the peer's exit dropped its mapping


OWNER = """
import sys
from kvstore.tiers.shm import SharedSegment
seg = SharedSegment.create(sys.argv[1], 8 << 20)
seg.buffer[:5] = b"alive"
print(seg.serve(), flush=True)
sys.stdin.read()
"""


def test_a_killed_owner_leaves_nothing_once_peers_unmap() -> None:
    name = new_segment_name("test-shm-killed")
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert owner.stdout is not None
        address = owner.stdout.readline().decode().strip()
        peer = SharedSegment.attach(name, address)
        assert sorted(holders(name)) == sorted([owner.pid, os.getpid()])
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
    assert bytes(peer.buffer[:5]) == b"alive"  # a peer's mapping outlives the owner
    assert holders(name) == [os.getpid()]
    peer.close()
    assert holders(name) == [] and shm_files(name) == []  # freed: no fd, no mapping, no file
    with pytest.raises(UnavailableError):
        SharedSegment.attach(name, address)


def test_reclaim_removes_only_this_nodes_old_files(tmp_path: Path) -> None:
    mine = ["kvs-n1-dram-0123abcd", "kvs-n1-ssd-89abcdef"]
    others = ["kvs-n1-x-dram-0123abcd", "kvs-n10-dram-0123abcd", "kvs-n1-dram-0123", "other"]
    for name in mine + others:
        (tmp_path / name).write_bytes(b"x")
    assert reclaim_stale_files("n1", str(tmp_path)) == sorted(mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)
    assert reclaim_stale_files("n1", str(tmp_path)) == []
    assert reclaim_stale_files("n1", str(tmp_path / "absent")) == []


def test_reclaim_in_dev_shm_maps_node_ids_like_segment_names() -> None:
    node = f"test/{os.getpid()}"  # '/' becomes '_' in segment names
    path = f"/dev/shm/kvs-test_{os.getpid()}-dram-deadbeef"
    with open(path, "wb") as f:
        f.write(b"stale")
    try:
        assert reclaim_stale_files(node) == [os.path.basename(path)]
        assert not os.path.exists(path)
    finally:
        if os.path.exists(path):
            os.unlink(path)
