"""Latency and transfer models used by the conductor's policies (no grpc, no torch)."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from kvstore.errors import BadRequestError, NotFoundError
from kvstore.types import Tier


@runtime_checkable
class LatencyModel(Protocol):
    """Predicts compute time of one prefill and one decode step on one node."""

    def prefill_s(self, new_tokens: int, cached_tokens: int) -> float:
        """Seconds to prefill `new_tokens` on top of `cached_tokens` already in KV."""
        ...

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """Seconds of one decode step of `batch` sequences with `context_tokens` in total."""
        ...


@dataclass(frozen=True, slots=True)
class TransferModel:
    """Time to bring cached KV into a prefill node's HBM.

    `tier_bytes_per_s[t]` is the read bandwidth of tier `t` (indexed by `Tier`);
    a block on another node (pooled mode) moves at min(its tier, the network).
    `overhead_s` is paid once per request that loads anything.
    """

    kv_bytes_per_token: int
    tier_bytes_per_s: tuple[float, float, float] = (4.0e12, 55e9, 3.0e9)
    network_bytes_per_s: float = 25e9
    overhead_s: float = 0.001

    def __post_init__(self) -> None:
        if self.kv_bytes_per_token <= 0:
            raise BadRequestError(f"kv_bytes_per_token must be > 0, got {self.kv_bytes_per_token}")
        if len(self.tier_bytes_per_s) != len(Tier) or min(self.tier_bytes_per_s) <= 0:
            raise BadRequestError(f"need {len(Tier)} positive tier bandwidths")
        if self.network_bytes_per_s <= 0 or self.overhead_s < 0:
            raise BadRequestError("network bandwidth must be > 0 and overhead >= 0")

    def bandwidth(self, tier: Tier, remote: bool) -> float:
        """Bytes/s at which a block in `tier` reaches the prefill node."""
        bw = self.tier_bytes_per_s[int(tier)]
        return min(bw, self.network_bytes_per_s) if remote else bw

    def load_s(self, tier_tokens: Mapping[Tier, float], remote: bool) -> float:
        """Seconds to load `tier_tokens` (tokens per tier); 0 when nothing is loaded."""
        empty: dict[Tier, float] = {}
        return (
            self.load_split_s(empty, tier_tokens)
            if remote
            else self.load_split_s(tier_tokens, empty)
        )

    def load_split_s(self, local: Mapping[Tier, float], remote: Mapping[Tier, float]) -> float:
        """Seconds to load tokens per tier from this node (`local`) and other nodes (`remote`)."""
        if sum(local.values()) + sum(remote.values()) <= 0:
            return 0.0
        secs = sum(n / self.bandwidth(t, False) for t, n in local.items())
        secs += sum(n / self.bandwidth(t, True) for t, n in remote.items())
        return self.overhead_s + secs * self.kv_bytes_per_token


@dataclass(frozen=True, slots=True)
class FitReport:
    """Relative error |model - measured| / measured of a fit, over its data points."""

    source: str
    points: int
    prefill_mean_rel_err: float
    prefill_max_rel_err: float
    decode_mean_rel_err: float
    decode_max_rel_err: float


@dataclass(frozen=True, slots=True)
class QuadraticLatencyModel:
    """prefill_ms = a + b*L + c*L^2 (L = new tokens; cached context adds 2*c*new*cached),
    decode_ms = a + b*sum_ctx + c*batch, with an optional second decode fit for large
    batches (DistServe's small/large split). `report` says how well it fits its data.
    """

    name: str
    prefill_ms: tuple[float, float, float]
    decode_ms: tuple[float, float, float]
    decode_large_ms: tuple[float, float, float] | None = None
    large_batch_from: int = 1 << 30
    report: FitReport | None = None

    def prefill_s(self, new_tokens: int, cached_tokens: int) -> float:
        if new_tokens <= 0:
            return 0.0
        a, b, c = self.prefill_ms
        attn = new_tokens * (new_tokens + 2 * max(cached_tokens, 0))
        return max(a + b * new_tokens + c * attn, 0.0) / 1e3

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        if batch <= 0:
            return 0.0
        large = self.decode_large_ms is not None and batch >= self.large_batch_from
        a, b, c = self.decode_large_ms if large and self.decode_large_ms else self.decode_ms
        return max(a + b * context_tokens + c * batch, 0.0) / 1e3

    def fit_report(self) -> FitReport:
        """The fit's relative error against the published points it came from."""
        if self.report is None:
            raise NotFoundError(f"latency model {self.name!r} was not fitted to data here")
        return self.report


def _lstsq_rel(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares weighted by 1/y (minimises relative error); returns (coef, rel_err)."""
    w = 1.0 / y
    coef, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    return coef, np.abs(x @ coef - y) / y


def fit_splitwise(
    csv_path: Path, model: str, hardware: str, tensor_parallel: int
) -> QuadraticLatencyModel:
    """Fit prefill and decode times of one (model, hardware, TP) of Splitwise's perf_model.csv.

    A row is a batch of `batch_size` prompts of `prompt_size` tokens generating
    `token_size` tokens: prefill L = batch*prompt (quadratic term batch*prompt^2);
    decode context = batch*(prompt + token_size/2), the mean over the generation.
    """
    rows = _read_rows(csv_path, model, hardware, tensor_parallel)
    p, bs, tok, y_pre, y_dec = (np.array(col, dtype=np.float64) for col in zip(*rows, strict=True))
    ones = np.ones_like(p)
    pre_coef, pre_err = _lstsq_rel(np.stack([ones, bs * p, bs * p * p], 1), y_pre)
    dec_coef, dec_err = _lstsq_rel(np.stack([ones, bs * (p + tok / 2), bs], 1), y_dec)
    name = f"{model}/{hardware}-tp{tensor_parallel}"
    report = FitReport(
        source=f"{csv_path.name} ({name})",
        points=len(rows),
        prefill_mean_rel_err=float(pre_err.mean()),
        prefill_max_rel_err=float(pre_err.max()),
        decode_mean_rel_err=float(dec_err.mean()),
        decode_max_rel_err=float(dec_err.max()),
    )
    return QuadraticLatencyModel(name, _triple(pre_coef), _triple(dec_coef), report=report)


def _triple(coef: np.ndarray) -> tuple[float, float, float]:
    return float(coef[0]), float(coef[1]), float(coef[2])


def _read_rows(
    csv_path: Path, model: str, hardware: str, tp: int
) -> list[tuple[float, float, float, float, float]]:
    if not csv_path.is_file():
        raise NotFoundError(f"latency data {csv_path} is missing (set KVSTORE_DATA_DIR)")
    with csv_path.open(newline="") as f:
        rows = [
            (
                float(r["prompt_size"]),
                float(r["batch_size"]),
                float(r["token_size"]),
                float(r["prompt_time"]),
                float(r["token_time"]),
            )
            for r in csv.DictReader(f)
            if (r["model"], r["hardware"], int(r["tensor_parallel"])) == (model, hardware, tp)
        ]
    if len(rows) < 3:
        raise NotFoundError(f"no data for {model} on {hardware} TP{tp} in {csv_path}")
    return rows


def distserve_model(json_path: Path, model: str, tensor_parallel: int) -> QuadraticLatencyModel:
    """DistServe's published coefficients for one model and TP degree, used as they are (PP=1)."""
    if not json_path.is_file():
        raise NotFoundError(f"latency data {json_path} is missing (set KVSTORE_DATA_DIR)")
    table = json.loads(json_path.read_text())
    try:
        entry = table[model][str(tensor_parallel)]
    except KeyError:
        raise NotFoundError(f"no DistServe profile for {model} TP{tensor_parallel}") from None
    a, b, c = entry["prefill"]
    return QuadraticLatencyModel(
        name=f"{model}/a100-80gb-tp{tensor_parallel} (DistServe)",
        prefill_ms=(a + 1.0, b, c),  # DistServe adds PP (=1 ms here) to the prefill time
        decode_ms=_triple(np.asarray(entry["decoding_smallbs"])),
        decode_large_ms=_triple(np.asarray(entry["decoding_largebs"])),
        large_batch_from=int(entry["decoding_large_small_bs_threshold"]),
    )
