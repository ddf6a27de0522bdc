"""Fixtures of the HA tests: a real etcd per test (skipped, saying why, where none can run)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ha.etcd import Etcd, find_etcd


def _etcd_client_missing() -> str:
    try:
        import etcd3aio  # noqa: F401
    except ImportError:
        return "etcd3aio not installed (pip install 'kvstore[ha]'; .ci/run does)"
    return ""


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Etcd]:
    """etcd on 127.0.0.1 with a temp data dir, stopped after the test."""
    if find_etcd() is None:
        pytest.skip("no etcd binary (apt-get install etcd-server; .ci/run does)")
    if why := _etcd_client_missing():
        pytest.skip(why)
    with Etcd(tmp_path / "etcd") as server:
        yield server
