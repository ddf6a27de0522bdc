"""The fd server's abstract socket belongs to its network namespace: a process on
the same emulated host maps the segment, one on another host (or in the root
namespace) cannot even reach the socket. This is why an abstract name is the right
address for shared memory: the namespaces share /dev/shm, not abstract sockets."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.errors import UnavailableError
from kvstore.tiers.shm import SharedSegment, new_segment_name
from tests.memfd import holders
from tests.netns.hosts import Network

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]
START_S = 30.0

OWNER = """
import sys
from kvstore.tiers.shm import SharedSegment
seg = SharedSegment.create(sys.argv[1], 1 << 20)
seg.buffer[:6] = b"netns!"
print("serving", seg.serve(), flush=True)
sys.stdin.read()
seg.close()
"""

PEER = """
import sys
from kvstore.errors import KVStoreError
from kvstore.tiers.shm import SharedSegment
try:
    with SharedSegment.attach(sys.argv[1], sys.argv[2]) as seg:
        print("read", bytes(seg.buffer[:6]).decode(), flush=True)
except KVStoreError as e:
    print("error", type(e).__name__, flush=True)
"""


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Network]:
    with Network(["a", "b"], tmp_path) as network:
        yield network


def test_fd_socket_is_reachable_only_inside_its_namespace(net: Network) -> None:
    name = new_segment_name("test-netns")
    owner = net.spawn("a", "owner", [sys.executable, "-c", OWNER, name], stdin=True)
    address = owner.reader.wait_for(b"serving ", START_S).split()[1].decode()
    same = net.spawn("a", "peer-a", [sys.executable, "-c", PEER, name, address])
    other = net.spawn("b", "peer-b", [sys.executable, "-c", PEER, name, address])
    assert same.reader.wait_for(b"", START_S) == b"read netns!"
    assert other.reader.wait_for(b"", START_S) == b"error UnavailableError"
    with pytest.raises(UnavailableError):  # the test process lives in the root namespace
        SharedSegment.attach(name, address)
    assert owner.popen.stdin is not None
    owner.popen.stdin.close()
    assert owner.popen.wait(START_S) == 0
    assert holders(name) == []
