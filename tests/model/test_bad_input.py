"""Bad requests fail with typed errors before any KV is written."""

from __future__ import annotations

import pytest
import torch

from kvstore.errors import BadRequestError, TooLargeError
from kvstore.model import Engine, ModelConfig, SeqState, allocate_kv_cache


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(ModelConfig.tiny(layers=2, max_position=64), seed=3, device="cpu")


@pytest.fixture
def kv(engine: Engine) -> list[torch.Tensor]:
    return allocate_kv_cache(engine.config, 4, 16)


@pytest.mark.parametrize(
    ("tokens", "table", "start", "error", "match"),
    [
        ([], [0], 0, BadRequestError, "empty"),
        ([1, 260], [0], 0, BadRequestError, "outside vocab"),
        ([-1], [0], 0, BadRequestError, "outside vocab"),
        ([1] * 65, [0, 1, 2, 3], 0, TooLargeError, "max_position"),
        ([1, 2], [0, 1, 2, 3], 63, TooLargeError, "max_position"),
        ([1], [0], -1, BadRequestError, "negative"),
        ([1] * 17, [0], 0, BadRequestError, "need 2"),
        ([1], [0], 16, BadRequestError, "need 2"),
        ([1], [4], 0, BadRequestError, "outside cache"),
    ],
)
def test_prefill_rejects(
    engine: Engine,
    kv: list[torch.Tensor],
    tokens: list[int],
    table: list[int],
    start: int,
    error: type[Exception],
    match: str,
) -> None:
    with pytest.raises(error, match=match):
        engine.prefill(tokens, table, start, kv)
    assert all(not layer.any() for layer in kv)  # nothing written


def test_decode_rejects(engine: Engine, kv: list[torch.Tensor]) -> None:
    with pytest.raises(BadRequestError, match="at least one"):
        engine.decode_step([], kv)
    with pytest.raises(BadRequestError, match="need 2"):
        engine.decode_step([SeqState(5, 16, (0,))], kv)
    with pytest.raises(TooLargeError):
        engine.decode_step([SeqState(5, 64, (0, 1, 2, 3))], kv)
    with pytest.raises(BadRequestError, match="outside vocab"):
        engine.decode_step([SeqState(999, 0, (0,))], kv)


def test_cache_layout_is_checked(engine: Engine, kv: list[torch.Tensor]) -> None:
    cfg = engine.config
    with pytest.raises(BadRequestError, match="layers"):
        engine.prefill([1], [0], 0, kv[:1])
    wrong_heads = allocate_kv_cache(ModelConfig.tiny(layers=2, kv_heads=4), 4, 16)
    with pytest.raises(BadRequestError, match="heads"):
        engine.prefill([1], [0], 0, wrong_heads)
    with pytest.raises(BadRequestError, match="float64"):
        engine.prefill([1], [0], 0, [t.double() for t in kv])
    with pytest.raises(BadRequestError, match="shape"):
        engine.prefill([1], [0], 0, [kv[0], kv[1][:2]])
    assert kv[0].shape == (4, 2, 16, cfg.kv_heads, cfg.head_dim)


def test_generate_and_config_reject(engine: Engine) -> None:
    with pytest.raises(BadRequestError):
        engine.generate([1, 2], 0)
    with pytest.raises(TooLargeError):
        engine.generate([1] * 60, 10)
    with pytest.raises(BadRequestError, match="kv_heads"):
        ModelConfig(heads=8, kv_heads=3)
    with pytest.raises(BadRequestError, match="dtype"):
        ModelConfig(dtype="int8")
    with pytest.raises(BadRequestError, match="positive"):
        ModelConfig(layers=0)
    with pytest.raises(BadRequestError, match="cache size"):
        allocate_kv_cache(engine.config, 0, 16)


def test_weights_must_match_config() -> None:
    weights = Engine(ModelConfig.tiny(layers=1), seed=0, device="cpu").state_dict()
    with pytest.raises(BadRequestError, match="do not match"):
        Engine(ModelConfig.tiny(layers=2), weights, device="cpu")
