"""Bad input and unreachable services: a typed error, within a bounded time, no damage."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from kvstore.client import Client, ClientConfig
from kvstore.errors import (
    BadRequestError,
    NoSpaceError,
    NotFoundError,
    TooLargeError,
    UnavailableError,
)
from tests.client.conftest import payload

pytestmark = pytest.mark.timeout(60)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "options",
    [
        {"transport": "rdma"},
        {"replicas": 0},
        {"timeout_s": 0},
        {"tenant": "a/b"},
        {"segment_bytes": -1},
    ],
)
def test_config_is_validated(options) -> None:
    with pytest.raises(BadRequestError):
        ClientConfig(master="127.0.0.1:1", **options)
    with pytest.raises(BadRequestError):
        ClientConfig(master="no-port")


def test_master_down_is_unavailable_quickly() -> None:
    start = time.monotonic()
    with Client(f"127.0.0.1:{_closed_port()}", timeout_s=2.0) as c:
        for call in (lambda: c.put("k", b"v"), lambda: c.get("k"), c.stats):
            with pytest.raises(UnavailableError):
                call()
    assert time.monotonic() - start < 6.0


def test_contributing_to_a_down_master_fails_cleanly() -> None:
    with pytest.raises(UnavailableError):
        Client(f"127.0.0.1:{_closed_port()}", segment_bytes=1 << 20, timeout_s=1.0)


def test_bad_keys_and_values(client, fresh) -> None:
    for key in ("", 7, "x" * 2000):
        with pytest.raises(BadRequestError):
            client.put(key, b"v")  # type: ignore[arg-type]
    with pytest.raises(BadRequestError):
        client.put(fresh(), object())
    with pytest.raises(BadRequestError):
        client.put(fresh(), np.zeros((10, 10))[:, :5])  # not contiguous
    with pytest.raises(BadRequestError):
        client.put(fresh(), b"")  # an empty object
    with pytest.raises(BadRequestError):
        client.batch_get("not-a-list")
    with pytest.raises(BadRequestError):
        client.batch_get_into([fresh()], [])
    assert not client.exists(fresh())


def test_more_replicas_than_nodes_is_no_space(client, fresh) -> None:
    with pytest.raises(NoSpaceError):
        client.put(fresh(), b"v", replicas=3)
    assert client.batch_put([(fresh(), b"v")], replicas=3)[0].__class__ is NoSpaceError
    assert not client.exists(fresh())


def test_ranges_out_of_bounds(client, fresh) -> None:
    buf = bytearray(100)
    for offset, length in ((-1, 10), (90, 20), (101, None)):
        with pytest.raises(BadRequestError):
            client.put_from(fresh(), buf, offset, length)
    assert not client.exists(fresh())


def test_get_into_too_small_leaves_buffer_untouched(client, fresh) -> None:
    value = payload(5000, seed=3)
    client.put(fresh(), value)
    out = bytearray(b"\xee" * 4999)
    with pytest.raises(TooLargeError):
        client.get_into(fresh(), out)
    assert out == bytearray(b"\xee" * 4999)
    with pytest.raises(BadRequestError):
        client.get_into(fresh(), b"\0" * 6000)  # read-only target
    assert client.get(fresh()) == value


def test_unknown_key(client, fresh) -> None:
    with pytest.raises(NotFoundError):
        client.get(fresh())
    with pytest.raises(NotFoundError):
        client.get_into(fresh(), bytearray(10))
    assert client.batch_get([fresh()]) == [None]


def test_closed_client_refuses(cluster) -> None:
    c = Client(cluster.address)
    c.close()
    c.close()
    with pytest.raises(BadRequestError):
        c.get("k")
