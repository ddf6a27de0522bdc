"""The same engine code path on CUDA (skipped without a device)."""

from __future__ import annotations

import pytest
import torch

from kvstore.model import Engine, ModelConfig, SeqState, allocate_kv_cache

pytestmark = pytest.mark.gpu

TOKENS = torch.randint(0, 256, (41,), generator=torch.Generator().manual_seed(0)).tolist()


def test_cuda_paged_prefill_matches_dense_and_cpu() -> None:
    cpu = Engine(ModelConfig.tiny(), seed=7, device="cpu")
    gpu = Engine(ModelConfig.tiny(), seed=7, device="cuda")
    kv = allocate_kv_cache(gpu.config, 3, 16, "cuda")
    logits = gpu.prefill(TOKENS, [2, 0, 1], 0, kv)
    assert logits.device.type == "cuda"
    torch.testing.assert_close(logits, gpu.forward_dense(TOKENS)[-1], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(logits.cpu(), cpu.forward_dense(TOKENS)[-1], rtol=1e-3, atol=1e-3)
    assert gpu.generate(TOKENS, 8) == cpu.generate(TOKENS, 8)


def test_cuda_batch_invariant_bit_exact_and_bf16_runs() -> None:
    engine = Engine(ModelConfig.tiny(layers=2), seed=7, device="cuda", batch_invariant=True)
    caches = []
    for sizes in ([41], [9, 32]):
        kv, pos = allocate_kv_cache(engine.config, 3, 16, "cuda"), 0
        for size in sizes:
            engine.prefill(TOKENS[pos : pos + size], [2, 0, 1], pos, kv)
            pos += size
        caches.append(kv)
    assert all(torch.equal(a, b) for a, b in zip(*caches, strict=True))
    bf16 = Engine(ModelConfig.tiny(dtype="bfloat16"), seed=7, device="cuda")
    kv = allocate_kv_cache(bf16.config, 4, 16, "cuda")
    first = bf16.prefill(TOKENS, [0, 1, 2], 0, kv)
    step = bf16.decode_step([SeqState(int(first.argmax()), 41, (0, 1, 2))], kv)
    assert step.shape == (1, 260) and torch.isfinite(step).all()
