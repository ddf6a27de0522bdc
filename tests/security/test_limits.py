"""Limits everywhere (issue 10, point 4), against a master served in-process: every
oversized field, count, batch or reply is refused with a typed status before anything
runs, the master's state is unchanged and its invariants hold, and Stats still answers."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from kvstore.master.objects import OBJECT_BYTES
from kvstore.v1 import common_pb2, master_pb2
from tests.security.helpers import InProcessMaster, code_of

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
MIB = 1 << 20


@pytest.fixture(scope="module")
def master() -> Iterator[InProcessMaster]:
    with InProcessMaster(None, node_ttl_s=3600, heartbeat_interval_s=1) as m:
        stub = m.stub(None)
        ep = common_pb2.NodeEndpoint(tcp_address="127.0.0.1:1")
        stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id="n1", endpoint=ep))
        stub.MountSegment(
            master_pb2.MountSegmentRequest(node_id="n1", segment="s", tier=1, capacity=64 * MIB)
        )
        item = master_pb2.PutStartItem(key="canary", size=100)
        stub.PutStart(master_pb2.PutStartRequest(client_id="c", items=[item]))
        stub.PutEnd(master_pb2.PutEndRequest(client_id="c", keys=["canary"]))
        yield m


def state_of(m: InProcessMaster) -> tuple[object, ...]:
    def snap() -> tuple[object, ...]:
        st = m.handle.state
        st.check_integrity()
        m.guard.check_integrity()
        nodes = {n: (i.endpoint, i.incarnation) for n, i in st.registry.nodes.items()}
        segs = {k: (s.capacity, s.used) for k, s in st.registry.segments.items()}
        return set(st.objects), nodes, segs, m.guard.ledger.metadata_bytes

    return m.on_loop(snap)  # type: ignore[no-any-return]


def assert_refused(m: InProcessMaster, call, code: grpc.StatusCode) -> None:  # type: ignore[no-untyped-def]
    before = state_of(m)
    assert code_of(call) == code
    assert state_of(m) == before
    stats = m.stub(None).Stats(master_pb2.StatsRequest(), timeout=5)  # still answers
    assert stats.objects == len(before[0])


def test_segment_capacity_past_the_address_space(master) -> None:  # type: ignore[no-untyped-def]
    stub = master.stub(None)
    for capacity in (2**64 - 1, (1 << 47) + 1):
        req = master_pb2.MountSegmentRequest(
            node_id="n1", segment="huge", tier=1, capacity=capacity
        )
        assert_refused(master, lambda r=req: stub.MountSegment(r), INVALID)
    stats = stub.Stats(master_pb2.StatsRequest())
    assert stats.capacity == 64 * MIB  # Stats encodes: no `Value out of range`


def test_node_metadata_and_ids(master) -> None:  # type: ignore[no-untyped-def]
    stub = master.stub(None)
    big = common_pb2.NodeEndpoint(tcp_address="127.0.0.1:2", nixl_metadata=b"x" * MIB)
    for i in range(66):  # the probe: 66 x 1 MiB of nixl_metadata pushed Stats past 64 MB
        req = master_pb2.RegisterNodeRequest(node_id=f"fat{i}", endpoint=big)
        assert code_of(lambda r=req: stub.RegisterNode(r)) == INVALID
    assert_refused(
        master,
        lambda: stub.RegisterNode(
            master_pb2.RegisterNodeRequest(
                node_id="x" * 257, endpoint=common_pb2.NodeEndpoint(tcp_address="127.0.0.1:2")
            )
        ),
        INVALID,
    )
    long_addr = common_pb2.NodeEndpoint(tcp_address="h" * 300)
    assert_refused(
        master,
        lambda: stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id="n9", endpoint=long_addr)),
        INVALID,
    )
    seg = master_pb2.MountSegmentRequest(node_id="n1", segment="s" * 256, tier=1, capacity=4096)
    assert_refused(master, lambda: stub.MountSegment(seg), INVALID)
    assert stub.Stats(master_pb2.StatsRequest()).ByteSize() < 4096


def test_keys_groups_and_batches(master) -> None:  # type: ignore[no-untyped-def]
    stub = master.stub(None)
    huge_group = master_pb2.PutStartRequest(client_id="c", items=[
        master_pb2.PutStartItem(key=f"g{i}", size=1, group="G" * MIB) for i in range(4)
    ])  # fmt: skip
    assert_refused(master, lambda: stub.PutStart(huge_group), INVALID)
    long_key = master_pb2.PutStartRequest(
        client_id="c", items=[master_pb2.PutStartItem(key="k" * 1025, size=1)]
    )
    assert_refused(master, lambda: stub.PutStart(long_key), INVALID)
    fifteen = master_pb2.BatchLookupRequest(keys=["K" * MIB + str(i) for i in range(15)])
    assert_refused(master, lambda: stub.BatchLookup(fifteen), INVALID)
    for method, req in [
        ("PutEnd", master_pb2.PutEndRequest(client_id="c", keys=["k" * 2000])),
        (
            "BatchLookup",
            master_pb2.BatchLookupRequest(keys=["k"], cached_keys=["k" * 2000], cached_reads=[1]),
        ),
        (
            "BatchLookup",
            master_pb2.BatchLookupRequest(keys=["k"], cached_keys=["k"], cached_reads=[1, 2]),
        ),
        ("Remove", master_pb2.RemoveRequest(keys=["k" * 2000])),
        ("Pin", master_pb2.PinRequest(keys=["k" * 2000])),
        ("Unpin", master_pb2.UnpinRequest(keys=["k" * 2000])),
        ("MatchPrefix", master_pb2.MatchPrefixRequest(keys=["k" * 2000])),
        ("ListObjects", master_pb2.ListObjectsRequest(prefix="p" * 2000)),
        ("Inspect", master_pb2.InspectRequest(key="k" * 2000)),
        ("PutStart", master_pb2.PutStartRequest(client_id="c" * 300)),
        ("Heartbeat", master_pb2.HeartbeatRequest(node_id="n\x00")),
    ]:
        assert_refused(master, lambda m=method, r=req: getattr(stub, m)(r), INVALID)


def test_batch_sizes() -> None:
    with InProcessMaster(None, max_batch=10) as m:
        stub = m.stub(None)
        keys = [f"k{i}" for i in range(11)]
        for method, req in [
            ("BatchLookup", master_pb2.BatchLookupRequest(keys=keys)),
            ("BatchLookup", master_pb2.BatchLookupRequest(
                keys=["k"], cached_keys=keys, cached_reads=[1] * 11)),
            ("PutRevoke", master_pb2.PutRevokeRequest(client_id="c", keys=keys)),
            ("Pin", master_pb2.PinRequest(keys=keys)),
            ("AnnounceObjects", master_pb2.AnnounceObjectsRequest(
                node_id="n", segment="s", objects=[master_pb2.AnnouncedObject(key=k) for k in keys]
            )),
            ("NodeTasks", master_pb2.NodeTasksRequest(
                node_id="n", done=[master_pb2.TaskResult()] * 11)),
        ]:  # fmt: skip
            assert_refused(m, lambda me=method, r=req: getattr(stub, me)(r), INVALID)


def test_malformed_protobuf_is_invalid_argument(master) -> None:  # type: ignore[no-untyped-def]
    ch = grpc.insecure_channel(master.address)
    for method in ("PutStart", "BatchLookup", "RegisterNode", "Stats"):
        call = ch.unary_unary(f"/kvstore.v1.Master/{method}")
        for garbage in (b"\xff\xff\xff\xff", b"\x0a\xff\x01", b"\x08" + b"\x80" * 11):
            assert_refused(master, lambda c=call, g=garbage: c(g, timeout=5), INVALID)
    ch.close()


def test_stats_stays_under_the_message_cap() -> None:
    with InProcessMaster(None, max_message_bytes=MIB, max_nixl_metadata_bytes=64 << 10) as m:
        stub = m.stub(None)
        meta = common_pb2.NodeEndpoint(tcp_address="127.0.0.1:3", nixl_metadata=b"m" * (60 << 10))
        codes = []
        for i in range(40):
            req = master_pb2.RegisterNodeRequest(node_id=f"n{i}", endpoint=meta)
            codes.append(code_of(lambda r=req: stub.RegisterNode(r)))
        ok = codes.count(grpc.StatusCode.OK)
        assert 0 < ok < 40 and set(codes[ok:]) == {EXHAUSTED}  # refused once it would not fit
        stats = stub.Stats(master_pb2.StatsRequest())
        assert len(stats.nodes) == ok and stats.ByteSize() < MIB


def test_counts_nodes_segments_objects_metadata() -> None:
    with InProcessMaster(None, max_nodes=2, max_segments_per_node=1, max_objects=3,
                         node_ttl_s=3600, heartbeat_interval_s=1) as m:  # fmt: skip
        stub = m.stub(None)
        ep = common_pb2.NodeEndpoint(tcp_address="127.0.0.1:1")
        for n in ("a", "b"):
            stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id=n, endpoint=ep))
        assert_refused(
            m,
            lambda: stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id="c", endpoint=ep)),
            EXHAUSTED,
        )
        stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id="a", endpoint=ep))  # re-register
        mount = master_pb2.MountSegmentRequest(node_id="a", segment="s", tier=1, capacity=MIB)
        stub.MountSegment(mount)
        stub.MountSegment(mount)  # the same segment again is a remount, not a new one
        second = master_pb2.MountSegmentRequest(node_id="a", segment="t", tier=1, capacity=MIB)
        assert_refused(m, lambda: stub.MountSegment(second), EXHAUSTED)
        items = [master_pb2.PutStartItem(key=f"o{i}", size=10) for i in range(4)]
        assert_refused(
            m,
            lambda: stub.PutStart(master_pb2.PutStartRequest(client_id="c", items=items)),
            EXHAUSTED,
        )
        stub.PutStart(master_pb2.PutStartRequest(client_id="c", items=items[:3]))
    bound = 3 * (OBJECT_BYTES + len("o0"))  # room for three objects' metadata, not four
    with InProcessMaster(None, max_metadata_bytes=bound) as m:
        stub = m.stub(None)
        stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id="a", endpoint=ep))
        stub.MountSegment(mount)
        items = [master_pb2.PutStartItem(key=f"o{i}", size=10) for i in range(4)]
        with pytest.raises(grpc.RpcError) as err:
            stub.PutStart(master_pb2.PutStartRequest(client_id="c", items=items))
        assert err.value.code() == EXHAUSTED
        assert f"max_metadata_bytes {bound}" in err.value.details()
        stub.PutStart(master_pb2.PutStartRequest(client_id="c", items=items[:2]))
        m.check()


def test_replies_are_refused_or_paged_before_they_pass_the_cap() -> None:
    with InProcessMaster(None, max_message_bytes=MIB, node_ttl_s=3600,
                         heartbeat_interval_s=1) as m:  # fmt: skip
        stub = m.stub(None)
        ep = common_pb2.NodeEndpoint(tcp_address="127.0.0.1:1")
        stub.RegisterNode(master_pb2.RegisterNodeRequest(node_id="n", endpoint=ep))
        stub.MountSegment(
            master_pb2.MountSegmentRequest(node_id="n", segment="s", tier=1, capacity=64 * MIB)
        )
        keys = [f"k{i}" for i in range(2000)]
        for start in range(0, 2000, 500):  # every object's group is 1000 bytes: hits are big
            items = [master_pb2.PutStartItem(key=k, size=8, group=f"{k}-" + "g" * 990)
                     for k in keys[start:start + 500]]  # fmt: skip
            stub.PutStart(master_pb2.PutStartRequest(client_id="c", items=items))
            stub.PutEnd(master_pb2.PutEndRequest(client_id="c", keys=keys[start : start + 500]))
        look = master_pb2.BatchLookupRequest(keys=keys, no_lease=True)
        with pytest.raises(grpc.RpcError) as err:
            stub.BatchLookup(look)  # ~2 MB of hits: refused before it is built
        assert err.value.code() == INVALID and "split the batch" in err.value.details()
        assert len(stub.BatchLookup(master_pb2.BatchLookupRequest(keys=keys[:500])).results) == 500
        seen, token = [], ""
        while True:  # a listing pages instead: every page fits
            page = stub.ListObjects(
                master_pb2.ListObjectsRequest(page_size=10_000, page_token=token)
            )
            seen += [o.key for o in page.objects]
            assert 0 < len(page.objects) < 2000 and page.ByteSize() < MIB
            token = page.next_page_token
            if not token:
                break
        assert sorted(seen) == sorted(keys)
        m.check()
