"""Greedy and seeded temperature/top-p sampling."""

from __future__ import annotations

import pytest
import torch

from kvstore.errors import BadRequestError
from kvstore.model import ByteTokenizer, Engine, ModelConfig, Sampler, SamplingParams
from kvstore.model.sampling import top_p_filter


def draws(params: SamplingParams, logits: torch.Tensor, n: int = 50) -> list[int]:
    sampler = Sampler(params)
    return [sampler.sample(logits) for _ in range(n)]


def test_greedy_is_argmax() -> None:
    logits = torch.tensor([0.1, 2.0, -1.0, 1.9])
    assert draws(SamplingParams(), logits, 3) == [1, 1, 1]


def test_seeded_sampling_is_reproducible_and_seed_dependent() -> None:
    logits = torch.randn(260, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=42)
    first = draws(params, logits)
    assert draws(params, logits) == first
    assert draws(SamplingParams(temperature=1.0, top_p=0.9, seed=43), logits) != first
    assert len(set(first)) > 5  # really sampling, not argmax


def test_top_p_keeps_smallest_set_reaching_mass() -> None:
    probs = torch.tensor([0.1, 0.5, 0.25, 0.15])
    assert top_p_filter(probs.clone(), 0.7).tolist() == pytest.approx([0, 2 / 3, 1 / 3, 0])
    assert top_p_filter(probs.clone(), 0.5).tolist() == [0.0, 1.0, 0.0, 0.0]
    assert top_p_filter(probs.clone(), 1.0).tolist() == probs.tolist()
    kept = draws(SamplingParams(temperature=1.0, top_p=0.7, seed=1), probs.log(), 200)
    assert set(kept) == {1, 2}


def test_engine_generate_seeded_is_reproducible() -> None:
    engine = Engine(ModelConfig.tiny(layers=1), seed=0, device="cpu")
    prompt = ByteTokenizer().encode("hello")
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    out = engine.generate(prompt, 12, params)
    assert engine.generate(prompt, 12, params) == out
    assert len(out) == 12


@pytest.mark.parametrize(
    "kwargs", [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"seed": -1}]
)
def test_bad_params(kwargs: dict[str, float]) -> None:
    with pytest.raises(BadRequestError):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_logits_must_be_a_vector() -> None:
    with pytest.raises(BadRequestError):
        Sampler(SamplingParams()).sample(torch.zeros(2, 3))


def test_byte_tokenizer_round_trip() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("héllo ✓", add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert ids[1:-1] == list("héllo ✓".encode())
    assert tok.decode(ids) == "héllo ✓"
    with pytest.raises(BadRequestError):
        tok.decode([260])
