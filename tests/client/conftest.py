"""Fixtures of the client tests: a real master + 2 storage nodes, fresh keys."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from kvstore.client import Client
from kvstore.transfer.nixl import nixl_available
from tests.cluster import cluster_fixture

cluster = cluster_fixture(
    scope="package", nodes=2, dram_bytes=8 << 20, ssd_bytes=4 << 20, nixl=nixl_available()
)


@pytest.fixture
def fresh() -> Callable[[str], str]:
    """Unique key names (tests share one cluster)."""
    tag = uuid.uuid4().hex[:8]
    return lambda name="k": f"{name}-{tag}"


@pytest.fixture
def client(cluster) -> Iterator[Client]:  # type: ignore[no-untyped-def]
    with Client(cluster.address, timeout_s=5.0) as c:
        yield c
        c.check_integrity()  # no registration outlived its call


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic random bytes."""
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
