"""Hugging Face-format save -> load round trips and checkpoint errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from kvstore.errors import BadRequestError
from kvstore.model import Engine, ModelConfig, allocate_kv_cache
from kvstore.model.checkpoint import INDEX_FILE, load_hf_checkpoint, save_hf_checkpoint

PROMPT = [256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]


def small(**kw: object) -> ModelConfig:
    return ModelConfig.tiny(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256, **kw)


def last_logits(engine: Engine) -> torch.Tensor:
    kv = allocate_kv_cache(engine.config, 1, 16, engine.device)
    return engine.prefill(PROMPT, [0], 0, kv)


@pytest.mark.parametrize(
    "config",
    [
        small(),
        small(model_type="qwen2", attention_bias=True, tie_embeddings=True, rope_theta=1e6),
        small(model_type="mistral", max_position=512),
    ],
    ids=["llama", "qwen2-bias-tied", "mistral"],
)
def test_round_trip_gives_identical_logits(tmp_path: Path, config: ModelConfig) -> None:
    engine = Engine(config, seed=11, device="cpu")
    files = save_hf_checkpoint(tmp_path, config, engine.state_dict())
    assert [f.name for f in files] == ["model.safetensors"]
    names = set(load_file(str(files[0])))
    assert ("lm_head.weight" in names) is not config.tie_embeddings
    assert ("model.layers.1.self_attn.k_proj.bias" in names) is config.attention_bias
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["model_type"] == config.model_type and hf["num_key_value_heads"] == 2
    loaded_config, weights = load_hf_checkpoint(tmp_path)
    assert loaded_config == config
    loaded = Engine(loaded_config, weights, device="cpu")
    assert torch.equal(last_logits(loaded), last_logits(engine))
    assert torch.equal(
        Engine.from_checkpoint(str(tmp_path), "cpu").forward_dense(PROMPT)[-1],
        engine.forward_dense(PROMPT)[-1],
    )


def test_sharded_with_index_and_by_glob(tmp_path: Path) -> None:
    config = small()
    engine = Engine(config, seed=5, device="cpu")
    files = save_hf_checkpoint(tmp_path, config, engine.state_dict(), max_shard_bytes=200_000)
    assert len(files) > 2 and (tmp_path / INDEX_FILE).is_file()
    ref = last_logits(engine)
    assert torch.equal(last_logits(Engine(*load_hf_checkpoint(tmp_path), device="cpu")), ref)
    (tmp_path / INDEX_FILE).unlink()  # no index: every *.safetensors file
    assert torch.equal(last_logits(Engine(*load_hf_checkpoint(tmp_path), device="cpu")), ref)


def test_bfloat16_checkpoint_keeps_dtype(tmp_path: Path) -> None:
    config = small(dtype="bfloat16")
    engine = Engine(config, seed=2, device="cpu")
    save_hf_checkpoint(tmp_path, config, engine.state_dict())
    loaded_config, weights = load_hf_checkpoint(tmp_path)
    assert loaded_config.dtype == "bfloat16"
    assert all(t.dtype == torch.bfloat16 for t in weights.values())
    assert torch.equal(
        last_logits(Engine(loaded_config, weights, device="cpu")), last_logits(engine)
    )


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    config = small()
    save_hf_checkpoint(tmp_path, config, Engine(config, seed=1, device="cpu").state_dict())
    return tmp_path


def edit_config(path: Path, **changes: object) -> None:
    hf = json.loads((path / "config.json").read_text())
    hf.update(changes)
    (path / "config.json").write_text(json.dumps(hf))


def edit_tensors(path: Path, drop: str = "", reshape: str = "") -> None:
    tensors = load_file(str(path / "model.safetensors"))
    tensors.pop(drop, None)
    if reshape:
        tensors[reshape] = tensors[reshape][:-1].contiguous()
    save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize(
    ("config_changes", "match"),
    [
        ({"model_type": "gpt2"}, "unsupported model_type"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
        ({"attention_bias": True}, "attention_bias"),
        ({"num_hidden_layers": None}, "bad value"),
        ({"torch_dtype": "int8"}, "dtype"),
        ({"num_key_value_heads": 3}, "kv_heads"),
    ],
)
def test_bad_config(saved: Path, config_changes: dict[str, object], match: str) -> None:
    edit_config(saved, **config_changes)
    with pytest.raises(BadRequestError, match=match):
        load_hf_checkpoint(saved)


def test_missing_key_and_bad_json(saved: Path) -> None:
    hf = json.loads((saved / "config.json").read_text())
    del hf["hidden_size"]
    (saved / "config.json").write_text(json.dumps(hf))
    with pytest.raises(BadRequestError, match="hidden_size"):
        load_hf_checkpoint(saved)
    (saved / "config.json").write_text("{not json")
    with pytest.raises(BadRequestError, match="JSON"):
        load_hf_checkpoint(saved)


def test_missing_and_misshapen_tensors(saved: Path) -> None:
    edit_tensors(saved, reshape="model.layers.0.mlp.up_proj.weight")
    with pytest.raises(BadRequestError, match=r"up_proj.weight has shape \(255, 128\)"):
        load_hf_checkpoint(saved)
    edit_tensors(saved, drop="model.norm.weight")
    with pytest.raises(BadRequestError, match=r"1 tensors missing.*model\.norm\.weight"):
        load_hf_checkpoint(saved)


def test_missing_files(tmp_path: Path, saved: Path) -> None:
    with pytest.raises(BadRequestError, match=r"config\.json"):
        load_hf_checkpoint(tmp_path / "nowhere")
    (saved / "model.safetensors").unlink()
    with pytest.raises(BadRequestError, match=r"no \*\.safetensors"):
        load_hf_checkpoint(saved)


def test_mistral_sliding_window_caps_positions(saved: Path) -> None:
    edit_config(saved, model_type="mistral", sliding_window=256, max_position_embeddings=4096)
    assert load_hf_checkpoint(saved)[0].max_position == 256
