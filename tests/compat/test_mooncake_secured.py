"""The facade's scatter/gather multi-buffer path on a secured pool (tokens; the data
plane checks a capability on every transfer): a real storage node, an in-process
master, the facade picking its credential from the process's KVSTORE_SECURITY_*
settings, as an engine would. Every buffer moves straight to and from the pool, over
TCP and over shared memory, and the node refuses none of it."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from kvstore.compat import mooncake_multi
from kvstore.compat.mooncake import MooncakeDistributedStore
from kvstore.node.config import NodeConfig
from kvstore.node.node import StorageNode
from tests.security.helpers import InProcessMaster, Pki

pytestmark = pytest.mark.slow
MIB = 1 << 20


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, StorageNode, Pki]]:
    pki = Pki(tmp_path_factory.mktemp("pki"))
    with InProcessMaster(pki.token_server(), heartbeat_interval_s=0.2) as master:
        node = StorageNode(NodeConfig(master=master.address, dram_bytes=16 * MIB,
                                      token_file=str(pki.token_file("n1"))))  # fmt: skip
        node.start()
        try:
            yield master.address, node, pki
        finally:
            node.stop()


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_scattered_buffers_on_a_secured_pool(
    secured: tuple[str, StorageNode, Pki], transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    address, node, pki = secured
    monkeypatch.setenv(
        "KVSTORE_SECURITY_TOKEN_FILE",
        str(pki.token_file("alice-1" if transport == "tcp" else "alice-2")),
    )
    monkeypatch.setenv("KVSTORE_TRANSPORT", transport)
    staged: list[object] = []
    real_join = mooncake_multi._join
    monkeypatch.setattr(mooncake_multi, "_join", lambda p: staged.append(p) or real_join(p))
    assert node.keyring is not None
    refused = node.keyring.refused
    kv = np.random.default_rng(3).integers(0, 255, size=(4, 3, 8192), dtype=np.uint8)
    out = np.zeros_like(kv)
    store = MooncakeDistributedStore()
    assert store.setup("localhost", "P2PHANDSHAKE", 0, 16 * MIB, "tcp", "", address) == 0
    try:
        keys = [f"sec-{transport}-{b}" for b in range(3)]
        ptrs = [[kv[layer, b].ctypes.data for layer in range(4)] for b in range(3)]
        optrs = [[out[layer, b].ctypes.data for layer in range(4)] for b in range(3)]
        sizes = [[8192] * 4] * 3
        assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0] * 3
        assert store.batch_get_into_multi_buffers(keys, optrs, sizes) == [4 * 8192] * 3
        assert np.array_equal(out, kv)
        out[:] = 0  # again: from the location cache, verified
        assert store.batch_get_into_multi_buffers(keys, optrs, sizes) == [4 * 8192] * 3
        assert np.array_equal(out, kv)
        assert store.get(keys[1]) == kv[:, 1].tobytes()
    finally:
        store.remove_all(True)
        assert store.close() == 0
    assert not staged and node.keyring.refused == refused
