"""vLLM's own, unmodified MooncakeStoreConnector on a kvstore pool (two engine processes).

Engine 1 prefills a prompt and saves its KV through kvstore's `mooncake.store` shim;
it exits. Engine 2 (a fresh process: nothing in its HBM cache) gets the same prompt:
the connector finds the prefix in the pool, loads it, and the engine computes only
the tail. In standalone-store mode the engines lend no memory: the KV lives on a
kvstore storage node and outlives engine 1 (docs/engines.md says why that mode).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster import Cluster
from tests.integrations import engines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
PY = engines.vllm_python()
SPEC = engines.ModelSpec()
PROMPT = [(7 * i + 3) % 1000 + 1 for i in range(100)]  # 3 full 32-token blocks + 4


@pytest.mark.skipif(PY is None, reason=engines.NO_VLLM)
def test_second_engine_served_from_pool(tmp_path: Path) -> None:
    assert PY is not None
    model = engines.make_model(PY, tmp_path / "model", SPEC)
    (tmp_path / "pool").mkdir()
    with Cluster(nodes=1, dram_bytes=256 << 20, workdir=tmp_path / "pool") as pool:
        env = engines.engine_env(pool.address, tmp_path)
        first = engines.generate(PY, model, "MooncakeStoreConnector", [PROMPT], env,
                                 tmp_path / "engine1.log")["results"][0]  # fmt: skip
        stats = pool.stats()
        full_blocks = len(PROMPT) // engines.BLOCK
        assert first["num_cached_tokens"] == 0
        # the bytes in the pool: one object per full block, all layers' K and V
        assert stats.complete == full_blocks
        assert stats.used == full_blocks * SPEC.block_bytes()
        second = engines.generate(PY, model, "MooncakeStoreConnector", [PROMPT], env,
                                  tmp_path / "engine2.log")["results"][0]  # fmt: skip
        assert second["num_cached_tokens"] == full_blocks * engines.BLOCK
        assert second["tokens"] == first["tokens"]
        assert pool.stats().hits >= full_blocks
