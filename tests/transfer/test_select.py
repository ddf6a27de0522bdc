"""Transport choice: choose_kind, make_engine and the routing AutoEngine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from kvstore.errors import BadRequestError
from kvstore.transfer.base import SegmentDescriptor, TransferOp, TransferRequest, local_host_id
from kvstore.transfer.select import AutoEngine, choose_kind, make_engine
from kvstore.transfer.serve import pattern
from kvstore.transfer.shm import ShmEngine
from kvstore.transfer.tcp import TcpEngine

from .conftest import ServerProcess

HERE = local_host_id()
META = b"m" * 9
SOCK = "@kvstore-fd-test"


@pytest.mark.parametrize(
    ("desc", "nixl", "kind"),
    [
        (
            SegmentDescriptor("s", 8, HERE, "127.0.0.1:1", True, META, shm_socket=SOCK),
            True,
            "shm",
        ),
        (SegmentDescriptor("s", 8, HERE, "127.0.0.1:1", shm=True), True, "tcp"),  # no fd socket
        (
            SegmentDescriptor("s", 8, "far", "10.0.0.2:1", True, META, shm_socket=SOCK),
            True,
            "nixl",
        ),
        (
            SegmentDescriptor("s", 8, "far", "10.0.0.2:1", shm=True, nixl_meta=META),
            False,
            "tcp",
        ),
        (SegmentDescriptor("s", 8, HERE, "127.0.0.1:1", shm=False), True, "tcp"),
        (SegmentDescriptor("s", 8, "far", "10.0.0.2:1"), True, "tcp"),
    ],
)
def test_choose_kind_prefers_shm_then_nixl_then_tcp(
    desc: SegmentDescriptor, nixl: bool, kind: str
) -> None:
    assert choose_kind(desc, nixl=nixl) == kind


def test_unreachable_segment_raises() -> None:
    with pytest.raises(BadRequestError, match="no transport"):
        choose_kind(SegmentDescriptor("s", 8, "far"), nixl=False)


def test_make_engine_forced_kinds_and_unknown_name() -> None:
    assert isinstance(make_engine("shm"), ShmEngine)
    assert isinstance(make_engine("tcp"), TcpEngine)
    assert isinstance(make_engine(), AutoEngine)
    with pytest.raises(BadRequestError, match="valid: auto, shm, tcp, nixl"):
        make_engine("rdma")


def test_auto_engine_routes_each_request_and_shares_buffers(
    serve: Callable[..., ServerProcess],
) -> None:
    server = serve(1 << 20, seed=5)
    tcp_only = replace(server.desc, shm=False)
    local = np.zeros(2048, dtype=np.uint8)
    with AutoEngine() as engine:
        buf = engine.register("b", local)
        results = engine.submit(
            [
                TransferRequest(TransferOp.READ, server.desc, 0, 1024, buf, 0),
                TransferRequest(TransferOp.READ, tcp_only, 4096, 1024, buf, 1024),
            ]
        ).wait(20)
        assert results == [None, None]
        assert engine.engine("shm").buffers.names() == ["b"]
        assert engine.engine("tcp").buffers.names() == ["b"]
        assert engine.unregister("b")
        assert engine.engine("tcp").buffers.names() == []
    expected = pattern(1 << 20, 5)
    assert np.array_equal(local[:1024], expected[:1024])
    assert np.array_equal(local[1024:], expected[4096:5120])
