"""kvstore's native vLLM connector (kvstore.integrations.vllm.KVStoreConnector), two
engine processes: engine 1 saves its prompt's blocks layer by layer; engine 2 (fresh)
loads them in one batched read. Then the pool loses part of the KV (layer 0 of every
block, while the lookup key survives): engine 3 sees the hit, its load fails, and it
recomputes (kv_load_failure_policy "recompute") to the same tokens; the failure is
logged once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.client.client import Client
from tests.cluster import Cluster
from tests.integrations import engines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
PY = engines.vllm_python()
SPEC = engines.ModelSpec()
PROMPT = [(11 * i + 5) % 1000 + 1 for i in range(100)]


@pytest.mark.skipif(PY is None, reason=engines.NO_VLLM)
def test_native_connector_two_engines_and_lost_kv(tmp_path: Path) -> None:
    assert PY is not None
    model = engines.make_model(PY, tmp_path / "model", SPEC)
    (tmp_path / "pool").mkdir()
    with Cluster(nodes=1, dram_bytes=256 << 20, workdir=tmp_path / "pool") as pool:
        env = engines.engine_env(pool.address, tmp_path)
        run = lambda name: engines.generate(PY, model, "KVStoreConnector", [PROMPT], env,  # noqa: E731
                                            tmp_path / f"{name}.log")["results"][0]  # fmt: skip
        first = run("engine1")
        full_blocks = len(PROMPT) // engines.BLOCK
        stats = pool.stats()
        assert first["num_cached_tokens"] == 0
        assert stats.used == full_blocks * SPEC.block_bytes()  # every layer of every block
        second = run("engine2")
        assert second["num_cached_tokens"] == full_blocks * engines.BLOCK
        assert second["tokens"] == first["tokens"]
        with Client(pool.address) as c:  # lose layer 0 of every block
            keys = [k for k in _keys(pool.address) if "/0/0/" in k]
            assert len(keys) == full_blocks
            for k in keys:
                assert c.remove(k, force=True)
        third = run("engine3")
        assert third["tokens"] == first["tokens"]  # recomputed, never wrong KV
        log = (tmp_path / "engine3.log").read_text()
        assert log.count("kvstore load failed") == 1


def _keys(master: str) -> list[str]:
    import grpc

    from kvstore.v1 import master_pb2, master_pb2_grpc

    with grpc.insecure_channel(master) as ch:
        reply = master_pb2_grpc.MasterStub(ch).ListObjects(
            master_pb2.ListObjectsRequest(page_size=10_000), timeout=10
        )
    return [o.key for o in reply.objects]
