"""Trace readers: real files, malformed lines, strict mode, synthetic generators."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvstore
from kvstore.sim.traces import (
    TraceError,
    read_azure,
    read_mooncake,
    read_trace,
    scale_rate,
    synthetic_poisson,
    synthetic_shared_prefix,
    window,
)

DATA = Path(kvstore.__file__).resolve().parent / "data"
MOONCAKE = DATA / "mooncake_conversation_trace.jsonl"
AZURE = DATA / "azure_conv_2023.csv"


GOOD = '{"timestamp": 1500, "input_length": 600, "output_length": 7, "hash_ids": [4, 9]}\n'


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_mooncake_reads_fields(tmp_path: Path) -> None:
    load = read_mooncake(_write(tmp_path, "t.jsonl", GOOD))
    (r,) = load.requests
    assert (r.req_id, r.arrival_s, r.input_len, r.output_len, r.blocks) == (0, 1.5, 600, 7, (4, 9))
    assert load.skipped == 0


def test_mooncake_malformed_lines_skipped_and_counted(tmp_path: Path) -> None:
    text = (
        GOOD
        + "{not json\n"
        + "\n"
        + '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}\n'
        + '{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
        + "[1, 2]\n"
        + GOOD
    )
    load = read_mooncake(_write(tmp_path, "t.jsonl", text))
    assert len(load.requests) == 2
    assert load.skipped == 4
    assert [line for line, _ in load.errors] == [2, 4, 5, 6]
    assert "1 hash_ids for input_length 600" in load.errors[1][1]


def test_mooncake_strict_names_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.jsonl", GOOD + GOOD + '{"timestamp": 1}\n')
    with pytest.raises(TraceError) as err:
        read_mooncake(path, strict=True)
    assert err.value.line == 3
    assert str(err.value).startswith(f"{path}:3: ")


def test_empty_trace_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no valid request"):
        read_mooncake(_write(tmp_path, "t.jsonl", "{bad\n"))


def test_azure_reads_relative_times_and_fresh_blocks(tmp_path: Path) -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,1000,44\n"
        "2023-11-16 18:15:47.1805900,513,9\n"
        "2023-11-16 18:15:48,x,9\n"
    )
    load = read_azure(_write(tmp_path, "a.csv", text))
    a, b = load.requests
    assert (a.arrival_s, a.input_len, a.blocks) == (0.0, 1000, (0, 1))
    assert b.arrival_s == pytest.approx(0.5)
    assert b.blocks == (2, 3)
    assert load.skipped == 1 and load.errors[0][0] == 4
    with pytest.raises(TraceError) as err:
        read_azure(tmp_path / "a.csv", strict=True)
    assert err.value.line == 4


def test_azure_bad_header(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=":1: not an Azure trace header"):
        read_azure(_write(tmp_path, "a.csv", "a,b,c\n1,2,3\n"))


def test_read_trace_dispatches_on_suffix(tmp_path: Path) -> None:
    assert len(read_trace(_write(tmp_path, "t.jsonl", GOOD)).requests) == 1
    with pytest.raises(TraceError, match="unknown trace format"):
        read_trace(_write(tmp_path, "t.txt", GOOD))


def test_synthetic_is_deterministic_and_shares_prefixes() -> None:
    a = synthetic_shared_prefix(50, rate=10.0, n_prefixes=3, prefix_blocks=4, seed=7)
    b = synthetic_shared_prefix(50, rate=10.0, n_prefixes=3, prefix_blocks=4, seed=7)
    assert a == b
    assert {r.blocks[:4] for r in a.requests} <= {(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)}
    assert len({r.blocks[4:] for r in a.requests}) == 50
    p = synthetic_poisson(20, rate=5.0, seed=1)
    assert len({b for r in p.requests for b in r.blocks}) == sum(len(r.blocks) for r in p.requests)


def test_scale_and_window(tmp_path: Path) -> None:
    load = synthetic_poisson(30, rate=1.0, seed=3)
    fast = scale_rate(load, 2.0)
    assert [r.arrival_s * 2 for r in fast.requests] == pytest.approx(
        [r.arrival_s for r in load.requests]
    )
    w = window(load, 5.0, 10.0)
    expect = [r for r in load.requests if 5.0 <= r.arrival_s < 15.0]
    assert [r.input_len for r in w.requests] == [r.input_len for r in expect]
    assert all(0 <= r.arrival_s < 10.0 for r in w.requests)


def test_real_traces_match_published_counts() -> None:
    m = read_mooncake(MOONCAKE)
    assert (len(m.requests), m.skipped) == (12031, 0)
    assert sum(len(r.blocks) for r in m.requests) == 288_500
    assert len({b for r in m.requests for b in r.blocks}) == 182_790
    assert m.duration_s / 60 == pytest.approx(58.9, abs=0.05)
    a = read_azure(AZURE)
    assert (len(a.requests), a.skipped) == (19366, 0)
    assert len(a.requests) / a.duration_s == pytest.approx(5.5, abs=0.05)
