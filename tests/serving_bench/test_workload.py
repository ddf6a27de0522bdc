"""Schedules: exact arrival times and kinds, bursts that leave the stream unchanged."""

from __future__ import annotations

import itertools

import pytest

from kvstore.errors import BadRequestError
from kvstore.serving_bench.workload import ChatSpec, MixSpec, conversations, mixed_schedule


def test_stream_without_jitter_is_evenly_spaced() -> None:
    spec = MixSpec(duration_s=1.0, stream_every_s=0.25, stream_prompt=4, stream_tokens=3, jitter=0)
    arrivals = mixed_schedule(spec)
    assert [a.at_s for a in arrivals] == [0.0, 0.25, 0.5, 0.75]
    assert [a.request_id for a in arrivals] == ["s0", "s1", "s2", "s3"]
    assert all(len(a.prompt) == 4 and a.max_tokens == 3 for a in arrivals)
    assert len({a.prompt for a in arrivals}) == 4


def test_bursts_add_long_prompts_and_keep_the_stream() -> None:
    spec = MixSpec(duration_s=3.0, stream_every_s=0.5, stream_prompt=8, stream_tokens=4,
                   burst_every_s=1.0, burst_size=2, burst_prompt=64, burst_tokens=2,
                   first_burst_s=0.5)  # fmt: skip
    with_bursts = mixed_schedule(spec)
    bursts = [a for a in with_bursts if a.kind == "burst"]
    assert [(a.at_s, a.request_id) for a in bursts] == [
        (0.5, "b0.0"), (0.5, "b0.1"), (1.5, "b1.0"), (1.5, "b1.1"), (2.5, "b2.0"), (2.5, "b2.1"),
    ]  # fmt: skip
    assert all(len(a.prompt) == 64 and a.max_tokens == 2 for a in bursts)
    stream = [a for a in with_bursts if a.kind == "stream"]
    assert stream == mixed_schedule(spec.without_bursts())
    assert [a.at_s for a in with_bursts] == sorted(a.at_s for a in with_bursts)


def test_same_seed_same_schedule() -> None:
    spec = MixSpec(duration_s=2.0, stream_every_s=0.3, stream_prompt=5, stream_tokens=2)
    assert mixed_schedule(spec) == mixed_schedule(spec)


def test_bad_specs_are_rejected() -> None:
    with pytest.raises(BadRequestError):
        MixSpec(duration_s=0, stream_every_s=1, stream_prompt=1, stream_tokens=1)
    with pytest.raises(BadRequestError):
        MixSpec(duration_s=1, stream_every_s=1, stream_prompt=1, stream_tokens=0)
    with pytest.raises(BadRequestError):
        ChatSpec(turns=0)


def test_conversations_share_the_system_prompt_and_grow() -> None:
    spec = ChatSpec(conversations=2, turns=3, system_tokens=32, user_tokens=8, reply_tokens=4)
    chats = conversations(spec)
    first = [c.next_turn() for c in chats]
    assert [a.request_id for a in first] == ["c0.t0", "c1.t0"]
    assert first[0].prompt[:32] == first[1].prompt[:32]
    assert first[0].prompt[32:] != first[1].prompt[32:]
    chats[0].add_reply([1, 2, 3, 4])
    second = chats[0].next_turn()
    assert second.prompt[:40] == first[0].prompt
    assert second.prompt[40:44] == (1, 2, 3, 4)
    assert len(second.prompt) == 52 and second.max_tokens == 4
    assert spec.max_prompt == 32 + 2 * 12 + 8


def test_poisson_arrivals_have_the_mean_gap() -> None:
    spec = MixSpec(duration_s=400.0, stream_every_s=0.5, stream_prompt=1, stream_tokens=1,
                   poisson=True, seed=3)  # fmt: skip
    times = [a.at_s for a in mixed_schedule(spec)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert 700 < len(times) < 900  # ~800 expected
    assert sum(gaps) / len(gaps) == pytest.approx(0.5, rel=0.1)
    assert min(gaps) < 0.05 < 1.5 < max(gaps)  # clumps and lulls, unlike the jittered clock
