"""Named model profiles: a fitted latency model plus the KV size of the model.

Data files are read by path: `data_dir()` is $KVSTORE_DATA_DIR, else the data shipped
inside the package (`kvstore/data/`, sources and licenses in its README.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import kvstore
from kvstore.conductor.latency import (
    FitReport,
    QuadraticLatencyModel,
    TransferModel,
    distserve_model,
    fit_splitwise,
)
from kvstore.errors import BadRequestError, NotFoundError

SPLITWISE_CSV = "splitwise_perf_model.csv"
DISTSERVE_JSON = "distserve/profiler-a100-80g.distserve.json"

# KV bytes per token, fp16: layers * kv_heads * head_dim * 2 (K and V) * 2 bytes.
KV_BYTES_PER_TOKEN = {
    "llama2-70b": 80 * 8 * 128 * 2 * 2,  # GQA, 8 KV heads
    "bloom-176b": 70 * 112 * 128 * 2 * 2,
    "facebook/opt-13b": 40 * 40 * 128 * 2 * 2,
    "facebook/opt-66b": 64 * 72 * 128 * 2 * 2,
}

# fp16 weight bytes per model (2 bytes per parameter)
WEIGHT_BYTES = {
    "llama2-70b": 140e9,
    "bloom-176b": 352e9,
    "facebook/opt-13b": 26e9,
    "facebook/opt-66b": 132e9,
}
# A hard context limit, where the model has one: OPT's learned absolute positions stop at
# 2048. Llama2 (RoPE) and BLOOM (ALiBi) are served at longer contexts by long-context
# variants (the Mooncake trace's mean prompt is 12k tokens), so none is enforced for them.
MAX_CONTEXT = {"facebook/opt-13b": 2048, "facebook/opt-66b": 2048}
GPU_BYTES = 80e9  # every GPU of the published data is an 80 GB part
KV_MEMORY_SHARE = 0.9  # of what the weights leave, as vLLM's gpu_memory_utilization

# short hardware names in profile names -> Splitwise's perf_model.csv `hardware` column
HARDWARE = {"a100": "a100-80gb", "h100": "h100-80gb", "h100pcap": "h100-80gb-pcap"}
_SPLITWISE = {"llama2-70b": (2, 4, 8), "bloom-176b": (8,)}
_DISTSERVE = {"opt-13b": (1, 2, 4), "opt-66b": (2, 3, 4, 8)}

# name -> (source, model, hardware, tensor parallel): every (model, hardware, TP) the
# shipped data covers
PROFILES: dict[str, tuple[str, str, str, int]] = {
    **{
        f"{model}/{hw}-tp{tp}": ("splitwise", model, full, tp)
        for model, tps in _SPLITWISE.items()
        for hw, full in HARDWARE.items()
        for tp in tps
    },
    **{
        f"{model}/a100-tp{tp}": ("distserve", f"facebook/{model}", "a100-80gb", tp)
        for model, tps in _DISTSERVE.items()
        for tp in tps
    },
}
DEFAULT_PROFILE = "llama2-70b/a100-tp4"


@dataclass(frozen=True, slots=True)
class Profile:
    """A model on some hardware: how long its compute takes and how big its KV is."""

    name: str
    latency: QuadraticLatencyModel
    transfer: TransferModel
    model: str = ""
    hardware: str = ""
    tensor_parallel: int = 1

    @property
    def gpus(self) -> int:
        return self.tensor_parallel

    @property
    def max_context_tokens(self) -> int | None:
        """The model's hard context limit (None: none enforced)."""
        return MAX_CONTEXT.get(self.model)

    @property
    def kv_capacity_tokens(self) -> int:
        """KV tokens one instance holds: its GPUs' memory less the weights, at 90%."""
        free = self.tensor_parallel * GPU_BYTES - WEIGHT_BYTES[self.model]
        if free <= 0:
            raise BadRequestError(f"{self.name}: the weights do not fit in {self.gpus} GPUs")
        return int(free * KV_MEMORY_SHARE / self.transfer.kv_bytes_per_token)


def profile_name(model: str, hardware: str, tensor_parallel: int) -> str:
    """The profile of `model` (e.g. "llama2-70b") on `hardware` ("a100", "h100", "h100pcap")
    at a TP degree; NotFoundError listing what the data has for that model."""
    name = f"{model}/{hardware}-tp{tensor_parallel}"
    if name not in PROFILES:
        have = sorted(p for p in PROFILES if p.startswith(f"{model}/"))
        raise NotFoundError(
            f"no published data for {name!r}; available: {', '.join(have) or 'none'} "
            f"(models: {', '.join(sorted({p.split('/')[0] for p in PROFILES}))})"
        )
    return name


def data_dir() -> Path:
    """Where the data files live; NotFoundError with the path tried when absent."""
    env = os.environ.get("KVSTORE_DATA_DIR")
    path = Path(env) if env else Path(kvstore.__file__).resolve().parent / "data"
    if not path.is_dir():
        raise NotFoundError(f"data directory {path} not found; set KVSTORE_DATA_DIR")
    return path


@cache
def load_profile(name: str = DEFAULT_PROFILE, directory: Path | None = None) -> Profile:
    """Build (once) the named profile from the published data it comes from."""
    if name not in PROFILES:
        raise BadRequestError(f"unknown profile {name!r}; valid: {', '.join(sorted(PROFILES))}")
    source, model, hardware, tp = PROFILES[name]
    root = directory if directory is not None else data_dir()
    if source == "splitwise":
        latency = fit_splitwise(root / SPLITWISE_CSV, model, hardware, tp)
    else:
        latency = distserve_model(root / DISTSERVE_JSON, model, tp)
    transfer = TransferModel(kv_bytes_per_token=KV_BYTES_PER_TOKEN[model])
    return Profile(name, latency, transfer, model, hardware, tp)


def fit_reports(directory: Path | None = None) -> dict[str, FitReport | None]:
    """Each profile's fit error against the published points it came from (None: DistServe's
    coefficients are used as published, there are no raw points here to compare with)."""
    return {name: load_profile(name, directory).latency.report for name in PROFILES}
