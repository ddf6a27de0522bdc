"""Descriptors, request validation, buffer views and handles (no I/O)."""

from __future__ import annotations

import threading

import pytest

from kvstore.errors import BadRequestError, NotFoundError, TooLargeError, TransferError
from kvstore.transfer.base import (
    BufferDescriptor,
    SegmentDescriptor,
    TransferHandle,
    TransferOp,
    TransferRequest,
    local_host_id,
    parse_endpoint,
)
from kvstore.transfer.shm import ShmEngine

SEG = SegmentDescriptor("seg", 1000, "other-host", "10.0.0.1:7000", False, b"\x00meta\xff")


def test_descriptor_roundtrips_through_bytes_and_dict() -> None:
    assert SegmentDescriptor.from_bytes(SEG.to_bytes()) == SEG
    assert SegmentDescriptor.from_dict(SEG.to_dict()) == SEG
    assert SEG.to_dict()["nixl_meta"] == "AG1ldGH/"
    assert not SEG.same_host
    assert SegmentDescriptor("s", 1, local_host_id()).same_host


@pytest.mark.parametrize(
    "data", [b"not json", b'{"name": "x"}', b'{"name": "", "size": 1, "host_id": "h"}', b"[1]"]
)
def test_bad_descriptor_bytes_raise_bad_request(data: bytes) -> None:
    with pytest.raises(BadRequestError):
        SegmentDescriptor.from_bytes(data)


@pytest.mark.parametrize("endpoint", ["nohost", "h:0", "h:70000", ":80", "h:x"])
def test_bad_endpoint_is_rejected(endpoint: str) -> None:
    with pytest.raises(BadRequestError):
        SegmentDescriptor("s", 1, "h", endpoint)


def test_parse_endpoint_accepts_ipv6_in_brackets() -> None:
    assert parse_endpoint("[::1]:8080") == ("::1", 8080)
    assert parse_endpoint("127.0.0.1:1") == ("127.0.0.1", 1)


def test_request_bounds_are_checked_before_any_io() -> None:
    local = BufferDescriptor("buf", 100)
    TransferRequest(TransferOp.READ, SEG, 900, 100, local)  # exactly fits both
    with pytest.raises(BadRequestError, match="outside segment"):
        TransferRequest(TransferOp.READ, SEG, 901, 100, local)
    with pytest.raises(TooLargeError, match="too small"):
        TransferRequest(TransferOp.WRITE, SEG, 0, 100, local, local_offset=1)
    with pytest.raises(BadRequestError):
        TransferRequest(TransferOp.READ, SEG, -1, 10, local)
    with pytest.raises(BadRequestError):
        TransferRequest(1, SEG, 0, 10, local)  # type: ignore[arg-type]


def test_registry_rejects_duplicates_and_unknown_buffers() -> None:
    engine = ShmEngine()
    desc = engine.register("a", bytearray(10))
    assert desc == BufferDescriptor("a", 10)
    with pytest.raises(BadRequestError):
        engine.register("a", bytearray(10))
    assert engine.unregister("a") and not engine.unregister("a")
    req = TransferRequest(TransferOp.READ, SEG, 0, 10, desc)
    with pytest.raises(NotFoundError):
        engine.submit([req])


def test_handle_reports_unfinished_requests_as_transfer_errors_on_timeout() -> None:
    handle = TransferHandle(3)
    handle.complete(0, None)
    handle.complete(2, BadRequestError("x"))
    results = handle.wait(0.01)
    assert results[0] is None and isinstance(results[2], BadRequestError)
    assert isinstance(results[1], TransferError)
    assert not handle.done()
    threading.Timer(0.01, handle.complete, args=(1, None)).start()
    assert handle.wait(5) == [None, None, results[2]]
    assert handle.done()
