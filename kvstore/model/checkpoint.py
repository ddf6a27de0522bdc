"""Hugging Face-format checkpoints: `config.json` + `*.safetensors` (Llama, Qwen2, Mistral).

Tensor names are HF's own (`model.layers.N.self_attn.q_proj.weight`, ...) and equal
the engine's parameter names, so loading is a name and shape check, no renaming.
HF Llama checkpoints store q/k already permuted for the rotate-half RoPE the engine
uses, so real checkpoints load as they are. Sharded checkpoints are read through
`model.safetensors.index.json`, or all `*.safetensors` files when there is no index.

Not supported (rejected with BadRequestError rather than run wrong): rope_scaling
other than default, Llama attention/MLP biases. A sliding window (Mistral, Qwen2)
caps `max_position` at the window, inside which attention is exact.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from kvstore.errors import BadRequestError
from kvstore.model.config import DTYPES, MODEL_TYPES, ModelConfig
from kvstore.model.llama import parameter_shapes

INDEX_FILE = "model.safetensors.index.json"
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # old checkpoints carry the RoPE table


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The config.json dict of a model."""
    return {
        "architectures": [ARCHITECTURES[config.model_type]],
        "model_type": config.model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden,
        "num_hidden_layers": config.layers,
        "num_attention_heads": config.heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_eps,
        "max_position_embeddings": config.max_position,
        "torch_dtype": config.dtype,
        "tie_word_embeddings": config.tie_embeddings,
        "hidden_act": "silu",
        "rope_scaling": None,
        **({"attention_bias": False} if config.model_type == "llama" else {}),
    }


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """A ModelConfig from a config.json dict; BadRequestError if unsupported."""
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise BadRequestError(f"unsupported model_type {model_type!r}; know {MODEL_TYPES}")
    _reject_unsupported(hf, model_type)
    try:
        heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        return ModelConfig(
            vocab_size=int(hf["vocab_size"]),
            hidden=hidden,
            layers=int(hf["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or hidden // heads),
            intermediate=int(hf["intermediate_size"]),
            rope_theta=float(_rope_theta(hf)),
            rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position=_max_position(hf),
            dtype=_dtype(hf),
            attention_bias=model_type == "qwen2",
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            model_type=model_type,
        )
    except BadRequestError:
        raise
    except KeyError as e:
        raise BadRequestError(f"config.json lacks {e.args[0]!r}") from e
    except (TypeError, ValueError) as e:
        raise BadRequestError(f"bad value in config.json: {e}") from e


def _reject_unsupported(hf: Mapping[str, Any], model_type: str) -> None:
    scaling = hf.get("rope_scaling")
    kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else scaling
    if scaling and kind != "default":
        raise BadRequestError(f"rope_scaling {scaling!r} is not supported")
    if model_type == "llama" and (hf.get("attention_bias") or hf.get("mlp_bias")):
        raise BadRequestError("Llama attention_bias / mlp_bias are not supported")
    if hf.get("hidden_act", "silu") != "silu":
        raise BadRequestError(f"hidden_act {hf['hidden_act']!r} is not supported")


def _rope_theta(hf: Mapping[str, Any]) -> float:
    params = hf.get("rope_parameters")  # newer transformers nest it here
    if isinstance(params, Mapping):
        if params.get("rope_type", "default") != "default":
            raise BadRequestError(f"rope_parameters {dict(params)!r} are not supported")
        return float(params.get("rope_theta", 10000.0))
    return float(hf.get("rope_theta", 10000.0))


def _max_position(hf: Mapping[str, Any]) -> int:
    limit = int(hf.get("max_position_embeddings", 2048))
    window = hf.get("sliding_window")
    uses_window = hf.get("use_sliding_window", hf.get("model_type") == "mistral")
    if window and uses_window:
        limit = min(limit, int(window))
    return limit


def _dtype(hf: Mapping[str, Any]) -> str:
    name = str(hf.get("torch_dtype") or hf.get("dtype") or "float32").removeprefix("torch.")
    if name not in DTYPES:
        raise BadRequestError(f"unsupported dtype {name!r}; know {sorted(DTYPES)}")
    return name


def check_weights(
    config: ModelConfig, weights: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The weights the model needs, each checked for presence and shape."""
    shapes = parameter_shapes(config)
    missing = [n for n in shapes if n not in weights]
    if missing:
        raise BadRequestError(f"{len(missing)} tensors missing, e.g. {missing[:3]}")
    extra = [n for n in weights if n not in shapes and not _ignorable(n, config)]
    if extra:
        raise BadRequestError(f"{len(extra)} unexpected tensors, e.g. {extra[:3]}")
    for name, shape in shapes.items():
        if weights[name].shape != shape:
            raise BadRequestError(
                f"{name} has shape {tuple(weights[name].shape)}, expected {tuple(shape)}"
            )
    return {n: weights[n] for n in shapes}


def _ignorable(name: str, config: ModelConfig) -> bool:
    tied_head = config.tie_embeddings and name == "lm_head.weight"
    return tied_head or name.endswith(_IGNORED_SUFFIXES)


def save_hf_checkpoint(
    directory: str | Path,
    config: ModelConfig,
    state_dict: Mapping[str, torch.Tensor],
    *,
    max_shard_bytes: int | None = None,
) -> list[Path]:
    """Write config.json and the weights (sharded with an index past max_shard_bytes).

    Returns the safetensors files written.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    weights = check_weights(config, state_dict)
    tensors = {n: t.detach().to("cpu", config.torch_dtype).contiguous() for n, t in weights.items()}
    (out / "config.json").write_text(json.dumps(config_to_hf(config), indent=2) + "\n")
    shards = _split(tensors, max_shard_bytes)
    if len(shards) == 1:
        names = ["model.safetensors"]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        _write_index(out, shards, names)
    for shard, name in zip(shards, names, strict=True):
        save_file(shard, str(out / name), metadata={"format": "pt"})
    return [out / n for n in names]


def _split(
    tensors: dict[str, torch.Tensor], max_bytes: int | None
) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if max_bytes is not None and shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    return shards


def _write_index(out: Path, shards: list[dict[str, torch.Tensor]], names: list[str]) -> None:
    weight_map = {t: name for shard, name in zip(shards, names, strict=True) for t in shard}
    total = sum(t.numel() * t.element_size() for shard in shards for t in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def load_hf_checkpoint(directory: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read a checkpoint directory: (config, CPU weights by HF name in config.dtype)."""
    root = Path(directory)
    config_path = root / "config.json"
    if not config_path.is_file():
        raise BadRequestError(f"{root} has no config.json")
    try:
        hf = json.loads(config_path.read_text())
    except json.JSONDecodeError as e:
        raise BadRequestError(f"{config_path} is not valid JSON: {e}") from e
    config = config_from_hf(hf)
    tensors: dict[str, torch.Tensor] = {}
    for path in _weight_files(root):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    weights = check_weights(config, tensors)
    return config, {n: t.to(config.torch_dtype) for n, t in weights.items()}


def _weight_files(root: Path) -> list[Path]:
    index = root / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = [root / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(root.glob("*.safetensors"))
    if not files:
        raise BadRequestError(f"{root} has no *.safetensors files")
    for f in files:
        if not f.is_file():
            raise BadRequestError(f"index names {f.name}, which is missing")
    return files
