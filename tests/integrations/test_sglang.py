"""SGLang HiCache on kvstore, tested without SGLang (it needs a CUDA torch and
sgl-kernel; it cannot be installed here): kvstore's native HiCacheStorage backend
against a host KV pool laid out as SGLang's (page_first), and a replay of the exact
call sequence SGLang's own Mooncake backend (mooncake_store.py) makes, on the facade.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kvstore.compat.mooncake import MooncakeDistributedStore
from kvstore.integrations.sglang import KVStoreHiCacheStorage
from tests.cluster import Cluster, cluster_fixture, stop_process

pytestmark = pytest.mark.timeout(120)
cluster = cluster_fixture(nodes=1, dram_bytes=32 << 20)
PAGE, PAGE_BYTES, PAGES = 4, 4096, 8  # tokens per page; bytes of K (or V) of one page


class HostPool:
    """SGLang's HostKVCache as its storage backends see it (page_first layout)."""

    layout = "page_first"
    page_size = PAGE

    def __init__(self, mla: bool = False) -> None:
        self.parts = 1 if mla else 2
        self.kv_buffer = torch.zeros(PAGES, self.parts, PAGE_BYTES, dtype=torch.uint8)

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        ptrs, sizes = [], []
        for page in (indices[::PAGE] // PAGE).tolist():
            for part in range(self.parts):
                ptrs.append(self.kv_buffer[page, part].data_ptr())
                sizes.append(PAGE_BYTES)
        return ptrs, sizes


class Config:
    def __init__(self, master: str, mla: bool = False) -> None:
        self.tp_rank, self.tp_size, self.is_mla_model = 0, 1, mla
        self.extra_config = {"master_server_address": master,
                             "extra_backend_tag": uuid.uuid4().hex[:8]}  # fmt: skip


def _indices(pages: list[int]) -> torch.Tensor:
    return torch.tensor([p * PAGE + t for p in pages for t in range(PAGE)])


@pytest.fixture(params=[False, True], ids=["mha", "mla"])
def backend(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[tuple[Any, HostPool]]:
    pool = HostPool(mla=request.param)
    b = KVStoreHiCacheStorage(Config(cluster.address, mla=request.param))
    b.register_mem_pool_host(pool)
    yield b, pool
    b.clear()
    b.close()


def test_native_backend_round_trip(backend: tuple[KVStoreHiCacheStorage, HostPool]) -> None:
    b, pool = backend
    pool.kv_buffer.copy_(torch.randint(0, 256, pool.kv_buffer.shape, dtype=torch.uint8))
    written = pool.kv_buffer.clone()
    keys = [f"page{i}" for i in range(4)]
    assert b.batch_set_v1(keys, _indices([0, 1, 2, 3])) == [True] * 4
    assert b.batch_set_v1(keys[:2], _indices([0, 1])) == [True] * 2  # already there
    assert b.batch_exists(keys) == 4 and b.batch_exists([keys[0], "nope", keys[1]]) == 1
    assert b.exists(keys[3]) and not b.exists("nope")
    pool.kv_buffer.zero_()
    assert b.batch_get_v1(keys, _indices([4, 5, 6, 7])) == [True] * 4
    assert torch.equal(pool.kv_buffer[4:8], written[0:4])
    assert b.batch_get_v1(["nope", keys[0]], _indices([0, 1])) == [False, True]


def test_bad_layout_refused(cluster: Cluster) -> None:
    b = KVStoreHiCacheStorage(Config(cluster.address))
    pool = HostPool()
    pool.layout = "layer_first"
    with pytest.raises(ValueError, match="page_first"):
        b.register_mem_pool_host(pool)
    b.close()
    with pytest.raises(ValueError, match="master_server_address"):
        KVStoreHiCacheStorage(None)


def test_lost_pool_is_a_miss_counted_once(tmp_path: Any) -> None:
    with Cluster(nodes=1, dram_bytes=8 << 20, workdir=tmp_path) as pool_procs:
        pool = HostPool()
        b = KVStoreHiCacheStorage(Config(pool_procs.address))
        # no location cache: every get needs the master (a writer's own gets are
        # otherwise served from where it wrote, master or not)
        b.client = type(b.client)(pool_procs.address, timeout_s=2.0, location_cache_entries=0)
        b.register_mem_pool_host(pool)
        assert b.batch_set_v1(["a"], _indices([0])) == [True]
        assert pool_procs.master is not None
        stop_process(pool_procs.master)
        assert b.batch_get_v1(["a"], _indices([1])) == [False]  # SGLang recomputes
        assert b.batch_set_v1(["b"], _indices([1])) == [False]
        assert b.batch_exists(["a"]) == 0 and b.failures == 3
        b.close()


def test_replay_of_sglang_mooncake_backend(cluster: Cluster) -> None:
    """The calls sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py makes,
    in order, with the results it asserts or branches on."""
    store = MooncakeDistributedStore()
    # MooncakeStore.__init__: positional setup, per-TP sizes, then warmup()
    assert store.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", cluster.address) == 0
    warm_key, warm = "sglang_mooncake_store_warmup_key" + uuid.uuid4().hex, bytes(4 * 1024)
    assert store.put(warm_key, warm) == 0
    assert store.is_exist(warm_key) == 1 and store.get(warm_key) == warm
    # register_mem_pool_host: the whole host KV buffer
    pool = HostPool()
    buf = pool.kv_buffer
    assert store.register_buffer(buf.data_ptr(), buf.numel() * buf.element_size()) == 0
    buf[:4].copy_(torch.randint(0, 256, buf[:4].shape, dtype=torch.uint8))
    # batch_set_v1 -> _batch_preprocess (k/v keys per page) -> batch_is_exist -> batch_put_from
    keys = [f"h{i}_0_{part}" for i in range(4) for part in ("k", "v")]
    ptrs, sizes = pool.get_page_buffer_meta(_indices([0, 1, 2, 3]))
    assert store.batch_is_exist(keys) == [0] * 8
    assert store.batch_put_from(keys, ptrs, sizes) == [0] * 8
    assert store.batch_is_exist(keys) == [1] * 8  # batch_exists counts the prefix
    # batch_get_v1 -> batch_get_into; results > 0 per k and v
    out_ptrs, out_sizes = pool.get_page_buffer_meta(_indices([4, 5, 6, 7]))
    assert store.batch_get_into(keys, out_ptrs, out_sizes) == [PAGE_BYTES] * 8
    assert torch.equal(buf[4:8], buf[0:4])
    assert store.batch_get_into(["missing_0_k"], out_ptrs[:1], out_sizes[:1])[0] < 0
    # clear() -> remove_all(): in Mooncake every key was just read, so leased, and stays;
    # here this store's reads of what it put were served from its writer lease, which
    # takes no read lease, and remove_all ends its writer leases first: all 9 go
    assert store.remove_all() == 9 and store.remove_all(True) == 0
    assert store.batch_is_exist(keys) == [0] * 8
    assert store.close() == 0
