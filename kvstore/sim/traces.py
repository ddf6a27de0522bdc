"""Request traces for the simulator: Mooncake jsonl, Azure csv, synthetic generators.

Mooncake (FAST'25) lines carry `timestamp` (ms), `input_length`, `output_length` and
`hash_ids`, one chained id per 512-token prompt block. Azure (Splitwise's trace) rows carry
only lengths; their requests get fresh, unshared block ids so that no prefix is reused.
Malformed lines are skipped and counted, or raise `TraceError` naming the line (strict).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from kvstore.errors import BadRequestError

BLOCK_TOKENS = 512


class TraceError(BadRequestError):
    """A trace file or line that cannot be read; `line` is 1-based (0 = whole file)."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: arrival time, lengths and its prompt's chained block ids."""

    req_id: int
    arrival_s: float
    input_len: int
    output_len: int
    blocks: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.arrival_s < 0 or self.input_len <= 0 or self.output_len < 0:
            raise BadRequestError(f"bad request {self.req_id}: {self}")


@dataclass(frozen=True, slots=True)
class TraceLoad:
    """What a reader returns: requests sorted by arrival, and what it skipped (line, why)."""

    requests: tuple[TraceRequest, ...]
    skipped: int = 0
    errors: tuple[tuple[int, str], ...] = field(default_factory=tuple)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s - self.requests[0].arrival_s if self.requests else 0.0


def _as_int(obj: dict[str, object], key: str, minimum: int) -> int:
    val = obj.get(key)
    if not isinstance(val, int) or isinstance(val, bool) or val < minimum:
        raise ValueError(f"{key} must be an int >= {minimum}, got {val!r}")
    return val


def _mooncake_request(req_id: int, text: str) -> TraceRequest:
    obj = json.loads(text)
    if not isinstance(obj, dict):
        raise ValueError("line is not a JSON object")
    ts = obj.get("timestamp")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not math.isfinite(ts) or ts < 0:
        raise ValueError(f"timestamp must be a number >= 0, got {ts!r}")
    ids = obj.get("hash_ids")
    if not isinstance(ids, list) or not all(isinstance(h, int) for h in ids):
        raise ValueError("hash_ids must be a list of ints")
    n_in = _as_int(obj, "input_length", 1)
    n_out = _as_int(obj, "output_length", 0)
    if len(ids) != math.ceil(n_in / BLOCK_TOKENS):
        raise ValueError(f"{len(ids)} hash_ids for input_length {n_in}")
    return TraceRequest(req_id, ts / 1000.0, n_in, n_out, tuple(ids))


def _finish(path: str, reqs: list[TraceRequest], errors: list[tuple[int, str]]) -> TraceLoad:
    if not reqs:
        raise TraceError(path, 0, f"no valid request ({len(errors)} malformed lines)")
    reqs.sort(key=lambda r: r.arrival_s)
    return TraceLoad(tuple(reqs), len(errors), tuple(errors))


def read_mooncake(path: str | Path, *, strict: bool = False) -> TraceLoad:
    """Read a Mooncake trace (jsonl). Blank lines are ignored; bad lines skipped or raised."""
    reqs: list[TraceRequest] = []
    errors: list[tuple[int, str]] = []
    with open(path, encoding="utf-8") as f:
        for lineno, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                reqs.append(_mooncake_request(len(reqs), text))
            except (ValueError, BadRequestError) as exc:  # JSONDecodeError is a ValueError
                if strict:
                    raise TraceError(str(path), lineno, str(exc)) from exc
                errors.append((lineno, str(exc)))
    return _finish(str(path), reqs, errors)


def _parse_ts(text: str) -> float:
    text = text.strip()
    if "." in text:  # Azure writes 7 fractional digits; datetime takes at most 6
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(text).timestamp()


def read_azure(path: str | Path, *, strict: bool = False) -> TraceLoad:
    """Read an Azure LLM inference trace (csv: TIMESTAMP, ContextTokens, GeneratedTokens).

    Arrivals are made relative to the first request. Every request gets its own fresh block
    ids (the trace has no prefix information), so prefix caching can never hit on it.
    """
    rows: list[tuple[int, float, int, int]] = []
    errors: list[tuple[int, str]] = []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != [
            "TIMESTAMP",
            "ContextTokens",
            "GeneratedTokens",
        ]:
            raise TraceError(str(path), 1, f"not an Azure trace header: {header!r}")
        for row in reader:
            lineno = reader.line_num
            try:
                if len(row) < 3:
                    raise ValueError(f"expected 3 columns, got {len(row)}")
                n_in, n_out = int(row[1]), int(row[2])
                if n_in <= 0 or n_out < 0:
                    raise ValueError(f"bad lengths {n_in}, {n_out}")
                rows.append((lineno, _parse_ts(row[0]), n_in, n_out))
            except ValueError as exc:
                if strict:
                    raise TraceError(str(path), lineno, str(exc)) from exc
                errors.append((lineno, str(exc)))
    t0 = min((r[1] for r in rows), default=0.0)
    return _finish(str(path), list(_fresh_block_requests(rows, t0)), errors)


def _fresh_block_requests(
    rows: Iterable[tuple[int, float, int, int]], t0: float
) -> Iterator[TraceRequest]:
    next_block = 0
    for i, (_, ts, n_in, n_out) in enumerate(rows):
        n_blocks = math.ceil(n_in / BLOCK_TOKENS)
        yield TraceRequest(i, ts - t0, n_in, n_out, tuple(range(next_block, next_block + n_blocks)))
        next_block += n_blocks


def read_trace(path: str | Path, *, strict: bool = False) -> TraceLoad:
    """Read either format, chosen by the file's suffix (.jsonl Mooncake, .csv Azure)."""
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json"):
        return read_mooncake(path, strict=strict)
    if suffix == ".csv":
        return read_azure(path, strict=strict)
    raise TraceError(str(path), 0, f"unknown trace format {suffix!r} (want .jsonl or .csv)")


def synthetic_shared_prefix(
    n_requests: int,
    *,
    rate: float,
    n_prefixes: int = 8,
    prefix_blocks: int = 8,
    suffix_blocks: int = 2,
    output_len: int = 128,
    seed: int = 0,
) -> TraceLoad:
    """Poisson arrivals; each prompt = one of `n_prefixes` shared prefixes (Zipf-ish) + a
    unique suffix. Deterministic for a given seed."""
    if n_requests <= 0 or rate <= 0 or n_prefixes <= 0 or prefix_blocks < 0 or suffix_blocks < 1:
        raise BadRequestError("synthetic_shared_prefix: counts and rate must be positive")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n_requests))
    weights = 1.0 / np.arange(1, n_prefixes + 1)
    choice = rng.choice(n_prefixes, size=n_requests, p=weights / weights.sum())
    base = n_prefixes * prefix_blocks
    reqs = []
    for i in range(n_requests):
        p = int(choice[i])
        prefix = range(p * prefix_blocks, (p + 1) * prefix_blocks)
        suffix = range(base + i * suffix_blocks, base + (i + 1) * suffix_blocks)
        blocks = (*prefix, *suffix)
        reqs.append(
            TraceRequest(i, float(arrivals[i]), len(blocks) * BLOCK_TOKENS, output_len, blocks)
        )
    return TraceLoad(tuple(reqs))


def synthetic_poisson(
    n_requests: int,
    *,
    rate: float,
    mean_input: int = 1024,
    mean_output: int = 200,
    seed: int = 0,
) -> TraceLoad:
    """Poisson arrivals, exponential lengths, no shared prefixes (Azure-like)."""
    if n_requests <= 0 or rate <= 0 or mean_input <= 0 or mean_output <= 0:
        raise BadRequestError("synthetic_poisson: counts, rate and means must be positive")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n_requests))
    n_in = np.maximum(1, rng.exponential(mean_input, n_requests).astype(int))
    n_out = np.maximum(1, rng.exponential(mean_output, n_requests).astype(int))
    rows = ((i, float(arrivals[i]), int(n_in[i]), int(n_out[i])) for i in range(n_requests))
    return TraceLoad(tuple(_fresh_block_requests(rows, 0.0)))


def scale_rate(load: TraceLoad, factor: float) -> TraceLoad:
    """The same requests arriving `factor` times faster (arrival times divided by factor)."""
    if not factor > 0:
        raise BadRequestError(f"rate factor must be > 0, got {factor}")
    reqs = tuple(
        TraceRequest(r.req_id, r.arrival_s / factor, r.input_len, r.output_len, r.blocks)
        for r in load.requests
    )
    return TraceLoad(reqs, load.skipped, load.errors)


def window(load: TraceLoad, start_s: float, length_s: float) -> TraceLoad:
    """Requests arriving in [start_s, start_s + length_s), shifted to start at 0."""
    sel = [r for r in load.requests if start_s <= r.arrival_s < start_s + length_s]
    reqs = tuple(
        TraceRequest(i, r.arrival_s - start_s, r.input_len, r.output_len, r.blocks)
        for i, r in enumerate(sel)
    )
    return TraceLoad(reqs, load.skipped, load.errors)
