"""Percentiles, TBT from streamed chunks, and summaries with exact values."""

from __future__ import annotations

import math

import pytest

from kvstore.errors import BadRequestError
from kvstore.serving_bench.metrics import Dist, RequestRecord, percentile, summarize


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0


def test_percentile_rejects_empty_and_bad_q() -> None:
    with pytest.raises(BadRequestError):
        percentile([], 50)
    with pytest.raises(BadRequestError):
        percentile([1.0], 101)


def test_chunk_with_several_tokens_keeps_server_gaps() -> None:
    r = RequestRecord("r", "stream", 8, sent_s=10.0)
    r.add_chunk(10.5, [1], [0.45])
    r.add_chunk(10.9, [2, 3], [0.7, 0.85])  # two tokens 0.15 s apart, sent together
    assert r.tokens == [1, 2, 3]
    assert r.token_s == pytest.approx([10.5, 10.75, 10.9])
    assert r.ttft_s == pytest.approx(0.5)
    assert r.tbt_s() == pytest.approx([0.25, 0.15])


def test_chunk_without_server_times_counts_at_receipt() -> None:
    r = RequestRecord("r", "stream", 8, sent_s=0.0)
    r.add_chunk(1.0, [5, 6], [])
    assert r.token_s == [1.0, 1.0]


def _record(kind: str, sent: float, times: list[float], **kw: float) -> RequestRecord:
    r = RequestRecord(f"{kind}{sent}", kind, 16, sent_s=sent, **kw)  # type: ignore[arg-type]
    r.add_chunk(times[-1], list(range(len(times))), [t - sent for t in times])
    return r


def test_summary_filters_kinds_and_counts_failures() -> None:
    a = _record("stream", 0.0, [0.1, 0.2, 0.4], compute_s=0.05)
    b = _record("burst", 0.0, [1.0, 1.1], compute_s=1.0, publish_s=0.05, pull_s=0.02,
                publish_wait_s=0.01, kv_bytes=4096)  # fmt: skip
    failed = RequestRecord("x", "stream", 16, sent_s=0.0, error="UNAVAILABLE: gone")
    s = summarize([a, b, failed], kinds=("stream",))
    assert (s.requests, s.failed) == (2, 1)
    assert s.ttft.n == 1 and s.ttft.p50 == pytest.approx(0.1)
    assert s.tbt.n == 2 and s.tbt.max == pytest.approx(0.2)
    assert s.kv_fraction.n == 0 and s.kv_bytes == 0
    everything = summarize([a, b, failed])
    assert everything.kv_fraction.p50 == pytest.approx(0.07)
    assert everything.kv_exposed.p50 == pytest.approx(0.03)
    assert everything.kv_bytes == 4096


def test_empty_dist_is_json_safe() -> None:
    d = Dist.of([])
    assert d.n == 0 and math.isnan(d.p99)
    assert d.as_dict() == {"n": 0, "p50": None, "p99": None, "max": None}
    assert Dist.of([0.002, 0.004]).as_dict()["p50"] == 3.0
