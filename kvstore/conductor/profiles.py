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

# name -> (source, model, hardware, tensor parallel)
PROFILES: dict[str, tuple[str, str, str, int]] = {
    "llama2-70b/a100-tp4": ("splitwise", "llama2-70b", "a100-80gb", 4),
    "llama2-70b/h100-tp4": ("splitwise", "llama2-70b", "h100-80gb", 4),
    "llama2-70b/a100-tp8": ("splitwise", "llama2-70b", "a100-80gb", 8),
    "opt-13b/a100-tp1": ("distserve", "facebook/opt-13b", "a100-80gb", 1),
    "opt-66b/a100-tp2": ("distserve", "facebook/opt-66b", "a100-80gb", 2),
}
DEFAULT_PROFILE = "llama2-70b/a100-tp4"


@dataclass(frozen=True, slots=True)
class Profile:
    """A model on some hardware: how long its compute takes and how big its KV is."""

    name: str
    latency: QuadraticLatencyModel
    transfer: TransferModel


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
    return Profile(name, latency, TransferModel(kv_bytes_per_token=KV_BYTES_PER_TOKEN[model]))


def fit_reports(directory: Path | None = None) -> dict[str, FitReport | None]:
    """Each profile's fit error against the published points it came from (None: DistServe's
    coefficients are used as published, there are no raw points here to compare with)."""
    return {name: load_profile(name, directory).latency.report for name in PROFILES}
