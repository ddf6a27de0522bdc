"""The Mooncake facade against a real master and two storage-node processes.

Every expected code below is what mooncake.store.MooncakeDistributedStore 0.3.13
returns for the same call (checked by hand against its own master on 127.0.0.1).
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

from kvstore.compat.mooncake import (
    BufferPool,
    MooncakeDistributedStore,
    ReplicateConfig,
    transport_for,
)
from kvstore.compat.mooncake_codes import ErrorCode
from tests.cluster import Cluster, cluster_fixture

pytestmark = pytest.mark.timeout(120)
cluster = cluster_fixture(nodes=2, dram_bytes=8 << 20)
MiB = 1 << 20
NOT_FOUND, BAD, LEASED = -704, -600, -706


@pytest.fixture
def store(cluster: Cluster) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", cluster.address) == 0
    yield s
    assert s.remove_all(True) >= 0
    assert s.close() == 0


@pytest.fixture
def buf(store: MooncakeDistributedStore) -> np.ndarray:
    arr = np.zeros(MiB, dtype=np.uint8)
    assert store.register_buffer(arr.ctypes.data, arr.nbytes) == 0
    yield arr
    assert store.unregister_buffer(arr.ctypes.data) == 0


def test_put_get_and_existing_key(store: MooncakeDistributedStore) -> None:
    assert store.put("a", b"hello") == 0
    assert store.put("a", b"HELLO!") == 0  # Mooncake: a put of an existing key is a no-op
    assert store.get("a") == b"hello"
    assert store.get("missing") == b""
    assert (store.get_size("a"), store.get_size("missing")) == (5, NOT_FOUND)
    assert (store.is_exist("a"), store.is_exist("missing")) == (1, 0)
    assert store.batch_is_exist(["a", "missing", "a"]) == [1, 0, 1]
    host, port = store.get_hostname().split(":")  # Mooncake: "host:port", a port picked
    assert host == "127.0.0.1" and 12300 <= int(port) < 14300


def test_put_batch_get_batch(store: MooncakeDistributedStore) -> None:
    assert store.put_batch(["p1", "p2"], [b"one", bytearray(b"two")]) == 0
    assert store.put_batch(["p1", "p3"], [b"ONE", b"three"]) == 0  # p1 stays "one"
    assert store.get_batch(["p1", "nope", "p2", "p3"]) == [b"one", b"", b"two", b"three"]
    assert store.put_batch(["p4"], [b"a", b"b"]) == BAD


def test_put_from_get_into_registered(store: MooncakeDistributedStore, buf: np.ndarray) -> None:
    p = buf.ctypes.data
    payload = np.arange(300_000, dtype=np.uint32).view(np.uint8)[: 1000_000 - 1]
    buf[: payload.size] = payload
    assert store.put_from("big", p, payload.size) == 0
    buf[:] = 0
    assert store.get_into("big", p + 7, buf.size - 7) == payload.size
    assert np.array_equal(buf[7 : 7 + payload.size], payload)
    assert store.get_into("big", p, payload.size - 1) == BAD  # buffer too small
    assert store.get_into("missing", p, 100) == NOT_FOUND
    assert store.register_buffer(p + 64, 64) == BAD  # overlaps the registered buffer
    assert store.put_from("zero", p, 0) == BAD  # Mooncake answers 0 and stores nothing


def test_unregistered_memory_still_works(store: MooncakeDistributedStore) -> None:
    src = np.frombuffer(b"unregistered bytes", dtype=np.uint8).copy()
    dst = np.zeros(64, dtype=np.uint8)
    assert store.put_from("u", src.ctypes.data, src.size) == 0
    assert store.get_into("u", dst.ctypes.data, dst.size) == src.size
    assert bytes(dst[: src.size]) == b"unregistered bytes"
    assert store.unregister_buffer(dst.ctypes.data) == BAD


def test_buffer_pool_leases_registered_memory(store: MooncakeDistributedStore) -> None:
    """Mooncake's pool: max_regions leases at once, RuntimeError past it (non-blocking),
    no close while leases are out."""
    pool = BufferPool(store, max_bytes=3 * MiB, max_regions=2)
    a, b = pool.acquire(MiB), pool.acquire(2 * MiB, block=False)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.acquire(1, block=False)
    pool.check_integrity()
    a.buffer[:5] = b"lease"
    assert store.put_from("leased-buf", a.ptr, 5) == 0
    assert store.get_into("leased-buf", b.ptr, b.size) == 5 and bytes(b.buffer[:5]) == b"lease"
    assert store.register_buffer(a.ptr, 64) == BAD  # already registered by the pool
    a_ptr, b_ptr = a.ptr, b.ptr
    a.release()
    assert store.register_buffer(a_ptr, 64) == 0 and store.unregister_buffer(a_ptr) == 0
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    b.release()
    pool.close()
    assert store.unregister_buffer(b_ptr) == BAD  # release unregistered it
    pool.check_integrity()


def test_batches_report_per_key(store: MooncakeDistributedStore, buf: np.ndarray) -> None:
    p = buf.ctypes.data
    buf[:24] = np.frombuffer(b"AAAAAAAABBBBBBBBCCCCCCCC", dtype=np.uint8)
    assert store.put("c", b"old") == 0
    codes = store.batch_put_from(["a", "b", "c", "bad"], [p, p + 8, p + 16, 0], [8, 8, 8, 8])
    assert codes == [0, 0, 0, BAD]
    assert store.get("c") == b"old"
    got = store.batch_get_into(["a", "nope", "b", "c"], [p + 100, p + 200, p + 300, p + 400],
                               [8, 8, 4, 8])  # fmt: skip
    assert got == [8, NOT_FOUND, BAD, 3]
    assert bytes(buf[100:108]) == b"AAAAAAAA" and bytes(buf[400:403]) == b"old"
    assert store.batch_put_from(["x"], [p], [8, 8]) == [BAD]  # lengths differ


def test_remove_codes(store: MooncakeDistributedStore, cluster: Cluster) -> None:
    assert store.put("r", b"1") == 0
    assert store.remove("r") == 0  # never read: no lease
    assert store.remove("r") == NOT_FOUND
    reader = MooncakeDistributedStore()  # another client's read lease blocks a remove
    assert reader.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", cluster.address) == 0
    assert store.put("leased", b"1") == 0 and reader.get("leased") == b"1"
    assert store.remove("leased") == LEASED  # read lease (5 s) still running
    assert store.batch_remove(["leased", "nope"]) == [LEASED, NOT_FOUND]
    assert store.remove("leased", True) == 0
    for k in ("k1", "k2", "k3"):
        assert store.put(k, b"v") == 0
    assert reader.get("k1") == b"v"  # a read leases k1
    assert store.remove_all() == 2
    assert store.remove_all(True) == 1
    assert reader.close() == 0
    assert cluster.stats().objects == 0


def test_replicate_config_places_two_replicas(store: MooncakeDistributedStore,
                                              cluster: Cluster) -> None:  # fmt: skip
    assert store.put("two", b"x" * 1000, ReplicateConfig(replica_num=2)) == 0
    stats = cluster.stats()
    assert sorted(s.objects for s in stats.segments) == [1, 1]
    assert store.get("two") == b"x" * 1000


def test_client_lends_its_segment_and_closes(cluster: Cluster) -> None:
    s = MooncakeDistributedStore()
    cfg = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
           "global_segment_size": str(4 * MiB), "master_server_addr": cluster.address}  # fmt: skip
    assert s.setup(cfg) == 0
    assert s.setup(cfg) == BAD  # already set up
    assert sum(g.capacity for g in cluster.stats().segments) == 2 * 8 * MiB + 4 * MiB
    assert s.put("mine", b"abc") == 0 and s.get("mine") == b"abc"
    assert s.remove("mine") == 0  # its own read lease does not block its own remove
    assert s.close() == 0 and s.close() == 0
    cluster.wait_stats(lambda st: sum(g.capacity for g in st.segments) == 2 * 8 * MiB)


def test_calls_before_setup_and_bad_setup() -> None:
    s = MooncakeDistributedStore()
    not_ready = int(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS)
    assert (s.put("a", b"1"), s.get("a"), s.is_exist("a")) == (not_ready, b"", not_ready)
    assert s.batch_get_into(["a", "b"], [1, 2], [1, 1]) == [not_ready, not_ready]
    assert s.remove_all() == not_ready and s.close() == 0 and s.get_hostname() == ""
    assert s.setup("h", "P2PHANDSHAKE", 0, 0, "carrier-pigeon", "", "127.0.0.1:1") == BAD
    assert s.setup("h", "P2PHANDSHAKE", 0, 0, "tcp", "", "no-port") == BAD
    assert s.setup("h", "P2PHANDSHAKE", 0, 0, "tcp", "", "127.0.0.1:1") == -900  # RPC_FAIL
    assert s.put("a", b"1") == not_ready  # a failed setup leaves it unusable
    assert [transport_for(p) for p in ("tcp", "rdma", "shm")] == ["auto", "auto", "shm"]


def _pybind_params(doc: str) -> list[str]:
    """Parameter names of the first signature line of a pybind11 docstring."""
    head = doc.strip().splitlines()[0]
    if head.startswith("setup("):  # overloaded: "1. setup(...)" is on a later line
        head = next(line for line in doc.splitlines() if line.startswith("1. setup("))
    inside = head[head.index("(") + 1 : head.rindex(")")]
    return [m.group(1) for m in re.finditer(r"(\w+): ", inside)][1:]  # drop self


def _mooncake_methods() -> list[str]:
    try:
        from mooncake.store import MooncakeDistributedStore as Theirs
    except ImportError:  # the wheel (or its libibverbs) is absent: the test skips
        return ["setup"]
    return sorted(n for n in dir(Theirs) if not n.startswith("_"))


@pytest.mark.parametrize("name", _mooncake_methods())
def test_signatures_match_mooncake(name: str) -> None:
    """Every public method of Mooncake's class exists here with its parameter names."""
    store_mod = pytest.importorskip("mooncake.store")
    theirs = _pybind_params(getattr(store_mod.MooncakeDistributedStore, name).__doc__)
    fn = (
        MooncakeDistributedStore._setup
        if name == "setup"
        else getattr(MooncakeDistributedStore, name)
    )
    params = inspect.signature(fn).parameters
    ours = [p for p in params if params[p].kind is not inspect.Parameter.VAR_KEYWORD][1:]
    if any(params[p].kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return  # put_parts(key, *parts, config=...): pybind lists "*args"
    if name in ("query_task",):
        theirs = theirs[:1]
    assert len(ours) >= len(theirs), (ours, theirs)
    for mine, their in zip(ours, theirs, strict=False):
        assert their.startswith("arg") or mine == their, (ours, theirs)  # pybind "arg0": unnamed
