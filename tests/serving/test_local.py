"""Prefill worker + decode scheduler in one process over a local tiered store
(DRAM or SSD tier): token identity, prefix hits, missing blocks, cancellation,
continuous batching and admission by free KV blocks. No gRPC here."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from kvstore.errors import BadRequestError, NoSpaceError, NotFoundError, TooLargeError
from kvstore.model import Engine, SamplingParams
from kvstore.serving.config import ServingConfig, build_engine
from kvstore.serving.jobs import DecodeJob, Finish, JobEvent
from kvstore.serving.kv_io import object_keys
from kvstore.serving.prefill import PrefillWorker
from kvstore.serving.request import Request
from kvstore.serving.scheduler import DecodeScheduler
from kvstore.serving.store import LocalBlockStore
from kvstore.tiers.dram import DramConfig, DramTier
from kvstore.tiers.ssd import SsdTier
from kvstore.tiers.ssd_handles import SsdConfig
from kvstore.tiers.tiered import TieredConfig, TieredStore
from kvstore.types import Tier
from tests.serving.helpers import Collected, RecordingStore, submit

CONFIG = ServingConfig(num_blocks=48, chunk_tokens=32)
PROMPT_A = tuple((7 * i + 3) % 256 for i in range(100))  # 6 full blocks + 4-token tail
PROMPT_B = PROMPT_A[:80] + tuple((5 * i + 1) % 256 for i in range(10))  # shares 5 blocks
LAYER_BYTES = 2 * 16 * 2 * 32 * 4  # one (block, layer) object of the tiny model


@pytest.fixture(scope="module")
def engine() -> Engine:
    return build_engine(CONFIG)


@pytest.fixture(scope="module")
def reference(engine: Engine) -> dict[tuple[int, ...], list[int]]:
    """Colocated single-sequence generation: the tokens every path must reproduce."""
    return {p: engine.generate(list(p), 6) for p in (PROMPT_A, PROMPT_B)}


def make_store(kind: Tier, tmp_path: Path) -> LocalBlockStore:
    if kind is Tier.DRAM:
        return LocalBlockStore(TieredStore([DramTier(DramConfig(capacity_bytes=8 << 20))]))
    ssd = SsdTier(SsdConfig(directory=str(tmp_path / "ssd"), capacity_bytes=8 << 20))
    return LocalBlockStore(TieredStore([ssd], TieredConfig(write_tier=Tier.SSD)))


@pytest.fixture(params=[Tier.DRAM, Tier.SSD], ids=["dram", "ssd"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalBlockStore]:
    s = make_store(request.param, tmp_path)
    yield s
    s.store.check_integrity()
    s.close()


@pytest.fixture
def kv_objects() -> str:
    """Object shape of the prefill side; tests parametrize it to cover both."""
    return "layer"


@pytest.fixture
def nodes(
    engine: Engine, store: LocalBlockStore, kv_objects: str
) -> Iterator[tuple[PrefillWorker, DecodeScheduler]]:
    config = replace(CONFIG, kv_objects=kv_objects)
    prefill, decode = PrefillWorker(config, engine, store), DecodeScheduler(CONFIG, engine, store)
    yield prefill, decode
    assert decode.wait_idle(10.0)
    decode.check_integrity()
    assert decode.stats().free_blocks == CONFIG.num_blocks
    decode.stop()
    prefill.close()


@pytest.mark.parametrize("kv_objects", ["layer", "block"])
def test_colocated_disaggregated_and_cached_prefix_agree(
    nodes: tuple[PrefillWorker, DecodeScheduler],
    store: LocalBlockStore,
    reference: dict,
    kv_objects: str,
) -> None:
    prefill, decode = nodes
    a = Request("a", PROMPT_A, 6)
    assert submit(decode, a)[1].wait().tokens == reference[PROMPT_A]  # colocated
    pre = prefill.prefill(a)
    layered = kv_objects == "layer"
    assert pre.handoff.layered is layered
    assert all(store.batch_exists(object_keys(pre.handoff.refs[5], 4, layered)))
    assert not any(store.batch_exists(object_keys(pre.handoff.refs[5], 4, not layered)))
    assert (pre.cached_tokens, pre.handoff.tail_tokens, len(pre.handoff.block_hashes)) == (0, 4, 6)
    assert pre.timings.published_bytes == 7 * 4 * LAYER_BYTES  # 6 blocks + tail, 4 layers
    out = submit(decode, a, pre)[1].wait()
    assert out.tokens == reference[PROMPT_A]
    assert out.timings.pulled_bytes == 7 * 4 * LAYER_BYTES and not out.timings.recomputed
    tails = object_keys(pre.handoff.tail_key, 4, pre.handoff.layered)
    assert decode.wait_idle(5.0) and not any(store.batch_exists(tails))
    b = Request("b", PROMPT_B, 6)
    pre_b = prefill.prefill(b)  # 5 shared blocks come from the store
    assert pre_b.cached_tokens == 80 and pre_b.timings.published_bytes == 4 * LAYER_BYTES
    assert submit(decode, b, pre_b)[1].wait().tokens == reference[PROMPT_B]


def test_seeded_sampling_same_colocated_and_disaggregated(
    engine: Engine, tmp_path: Path, reference: dict
) -> None:
    store = make_store(Tier.DRAM, tmp_path)
    prefill, decode = PrefillWorker(CONFIG, engine, store), DecodeScheduler(CONFIG, engine, store)
    try:
        hot = SamplingParams(temperature=1.5, seed=7)
        req = Request("s", PROMPT_A, 6, sampling=hot)
        colocated = submit(decode, req)[1].wait().tokens
        assert submit(decode, req, prefill.prefill(req))[1].wait().tokens == colocated
        other_seed = Request("s", PROMPT_A, 6, sampling=SamplingParams(temperature=1.5, seed=8))
        assert submit(decode, other_seed)[1].wait().tokens != colocated
        assert colocated != reference[PROMPT_A]  # it did sample
    finally:
        decode.stop()
        prefill.close()
        store.close()


def test_whole_prompt_cached_still_computes_last_block(
    nodes: tuple[PrefillWorker, DecodeScheduler], engine: Engine
) -> None:
    prefill, decode = nodes
    prompt = PROMPT_A[:96]  # exactly 6 blocks, no tail
    first = prefill.prefill(Request("x", prompt, 4))
    again = prefill.prefill(Request("y", prompt, 4))
    assert (first.cached_tokens, again.cached_tokens) == (0, 80)
    assert again.handoff.tail_key == "" and again.first_token == first.first_token
    out = submit(decode, Request("y", prompt, 4), again)[1].wait()
    assert out.tokens == engine.generate(list(prompt), 4)


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_missing_blocks_recompute_or_fail(
    engine: Engine, tmp_path: Path, reference: dict, policy: str
) -> None:
    store = make_store(Tier.DRAM, tmp_path)
    prefill = PrefillWorker(CONFIG, engine, store)
    decode = DecodeScheduler(replace(CONFIG, on_missing=policy), engine, store)
    try:
        pre = prefill.prefill(Request("a", PROMPT_A, 6))
        assert store.remove(object_keys(pre.handoff.refs[3], 4, True)[2])  # "evicted"
        out = submit(decode, Request("a", PROMPT_A, 6), pre)[1].wait()
        if policy == "recompute":
            assert out.tokens == reference[PROMPT_A] and out.timings.recomputed
        else:
            assert out.tokens == [] and isinstance(out.events[-1].error, NotFoundError)
            assert "unavailable" in str(out.events[-1].error)
        assert decode.wait_idle(5.0) and decode.stats().free_blocks == CONFIG.num_blocks
        tails = object_keys(pre.handoff.tail_key, 4, True)
        assert store.batch_exists(tails) == [False] * 4  # dropped on either path
        decode.check_integrity()
    finally:
        decode.stop()
        prefill.close()
        store.close()


def test_cancel_frees_blocks_and_tail(
    nodes: tuple[PrefillWorker, DecodeScheduler], store: LocalBlockStore
) -> None:
    prefill, decode = nodes
    long = Request("long", PROMPT_A, 400)
    job, out = submit(decode, long)
    decode.cancel(job)
    assert decode.wait_idle(10.0) and len(out.tokens) < 400
    pre = prefill.prefill(long)
    job, out = submit(decode, long, pre)
    decode.cancel(job)
    assert decode.wait_idle(10.0) and len(out.tokens) < 400
    tails = object_keys(pre.handoff.tail_key, 4, True)
    assert store.batch_exists(tails) == [False] * 4
    assert decode.stats().failed == 2


def test_sequences_join_and_leave_the_batch(engine: Engine) -> None:
    decode = DecodeScheduler(CONFIG, engine, None)
    try:
        prompts = [PROMPT_A[:40], PROMPT_B[:33], PROMPT_A[50:70]]
        lengths = [3, 9, 6]
        reqs = [Request(f"r{i}", prompts[i], lengths[i]) for i in range(3)]
        outs = [submit(decode, r)[1] for r in reqs]
        for p, n, out in zip(prompts, lengths, outs, strict=True):
            assert out.wait().tokens == engine.generate(list(p), n)
        assert decode.wait_idle(5.0)
        assert decode.stats().steps < sum(n - 1 for n in lengths)  # steps were shared
        decode.check_integrity()
    finally:
        decode.stop()


def test_local_prefill_is_interleaved_with_decode_steps(engine: Engine) -> None:
    decode = DecodeScheduler(replace(CONFIG, chunk_tokens=16), engine, None)
    try:
        _, running = submit(decode, Request("a", PROMPT_A[:16], 60))
        first = threading.Event()
        marks: list[int] = []

        def on_token(event: JobEvent) -> None:
            if event.index == 0:
                marks.append(len(running.events))
                first.set()

        assert running.started.wait(30.0)
        before = len(running.events)
        decode.submit(DecodeJob(Request("b", PROMPT_A, 2), on_token))  # 7 chunks of 16
        assert first.wait(30.0)
        assert marks[0] - before >= 6  # a decode step after each of B's first 6 chunks
        assert running.wait().tokens == engine.generate(list(PROMPT_A[:16]), 60)
    finally:
        decode.stop()


def test_admission_waits_for_free_blocks(engine: Engine) -> None:
    decode = DecodeScheduler(replace(CONFIG, num_blocks=12), engine, None)
    order: list[str] = []
    try:
        a, b = Collected(), Collected()
        req_a, req_b = Request("a", PROMPT_A, 60), Request("b", PROMPT_B, 10)  # 10 and 7 blocks

        def tag(name: str, out: Collected) -> Callable[[JobEvent], None]:
            def sink(event: JobEvent) -> None:
                order.append(name)
                out.sink(event)

            return sink

        decode.submit(DecodeJob(req_a, tag("a", a)))
        decode.submit(DecodeJob(req_b, tag("b", b)))
        a.wait(), b.wait()
        assert order == ["a"] * 60 + ["b"] * 10  # b starts only after a freed its blocks
        assert b.timings.queue_s >= a.events[-1].time_s - a.events[0].time_s
        with pytest.raises(NoSpaceError):
            decode.submit(DecodeJob(Request("c", PROMPT_A, 200), b.sink))  # 19 blocks > 12
        decode.check_integrity()
    finally:
        decode.stop()


def test_bad_requests(engine: Engine) -> None:
    decode = DecodeScheduler(CONFIG, engine, None)
    prefill = PrefillWorker(CONFIG, engine, make_store(Tier.DRAM, Path("/nonexistent")))
    try:
        with pytest.raises(BadRequestError, match="empty prompt"):
            Request("e", (), 4)
        with pytest.raises(BadRequestError, match="max_tokens"):
            Request("e", (1,), 0)
        too_long = Request("t", (1,) * 2048, 1)
        with pytest.raises(TooLargeError, match="context"):
            prefill.prefill(too_long)
        with pytest.raises(TooLargeError, match="context"):
            submit(decode, Request("t", (1,) * 2000, 49))
        with pytest.raises(BadRequestError, match="vocab"):
            prefill.prefill(Request("v", (1, 999), 1))
        with pytest.raises(NotFoundError, match="unknown model id"):
            CONFIG.check_model("llama-70b")
    finally:
        decode.stop()
        prefill.close()


def test_finished_sequence_published_for_the_next_turn(engine: Engine, tmp_path: Path) -> None:
    store = make_store(Tier.DRAM, tmp_path)
    prefill = PrefillWorker(CONFIG, engine, store)
    decode = DecodeScheduler(replace(CONFIG, on_finish="publish"), engine, store)
    try:
        turn1 = Request("t1", PROMPT_A, 30)  # KV of 100 + 29 positions: 8 full blocks
        out = submit(decode, turn1, prefill.prefill(turn1))[1].wait()
        last = out.events[-1]  # the end waits for the blocks: the next turn finds them
        assert (last.token, last.finish, len(out.tokens)) == (None, Finish.LENGTH, 30)
        turn2 = Request("t2", (*PROMPT_A, *out.tokens, *PROMPT_B[:20]), 4)
        pre = prefill.prefill(turn2)
        assert pre.cached_tokens == 128  # 6 prompt blocks from prefill + 2 from decode
        got = submit(decode, turn2, pre)[1].wait().tokens
        assert got == engine.generate(list(turn2.prompt), 4)
        decode.check_integrity()
    finally:
        decode.stop()
        prefill.close()
        store.close()


@pytest.mark.gpu
def test_cuda_pool_stages_through_host(tmp_path: Path) -> None:
    """On a device the publisher gathers layers to host and pulls scatter them back."""
    config = replace(CONFIG, device="cuda")
    engine = build_engine(config)
    store = make_store(Tier.DRAM, tmp_path)
    prefill, decode = PrefillWorker(config, engine, store), DecodeScheduler(config, engine, store)
    try:
        want = engine.generate(list(PROMPT_A), 6)
        for name in ("cold", "cached"):
            req = Request(name, PROMPT_A, 6)
            assert submit(decode, req, prefill.prefill(req))[1].wait().tokens == want
        decode.check_integrity()
    finally:
        decode.stop()
        prefill.close()
        store.close()


def test_prefill_publishes_layer_by_layer(engine: Engine, tmp_path: Path) -> None:
    store = RecordingStore(make_store(Tier.DRAM, tmp_path))
    prefill = PrefillWorker(CONFIG, engine, store)
    try:
        pre = prefill.prefill(Request("a", PROMPT_A, 2))  # chunks of 32: 0-31, ..., 96-99
        blocks = [h.hex() for h in pre.handoff.block_hashes]
        tail = pre.handoff.tail_key
        want = [
            [f"{b}/L{layer}" for b in blocks[2 * c : 2 * c + 2]]
            + ([f"{tail}/L{layer}"] if c == 3 else [])
            for c in range(4)
            for layer in range(4)
        ]
        assert store.puts == want  # one write per (chunk, layer), in compute order
    finally:
        prefill.close()
        store.close()


def test_whole_blocks_are_published_per_chunk(engine: Engine, tmp_path: Path) -> None:
    store = RecordingStore(make_store(Tier.DRAM, tmp_path))
    prefill = PrefillWorker(replace(CONFIG, kv_objects="block"), engine, store)
    try:
        pre = prefill.prefill(Request("a", PROMPT_A, 2))
        refs = pre.handoff.refs  # 6 block hashes, then the tail key
        assert store.puts == [refs[0:2], refs[2:4], refs[4:6], refs[6:7]]
        assert store.inner.store.size_of(refs[0]) == 4 * LAYER_BYTES
    finally:
        prefill.close()
        store.close()


def test_failed_publish_fails_the_request_and_cleans_up(engine: Engine, tmp_path: Path) -> None:
    store = RecordingStore(make_store(Tier.DRAM, tmp_path), "/L2", NoSpaceError("pool full"))
    prefill = PrefillWorker(CONFIG, engine, store)
    try:
        with pytest.raises(NoSpaceError, match="pool full"):
            prefill.prefill(Request("a", PROMPT_A, 2))
        tail = store.puts[-1][-1].rsplit("/", 1)[0]
        assert tail.startswith("tail/a/")
        assert store.batch_exists([f"{tail}/L{i}" for i in range(4)]) == [False] * 4
        assert prefill.kv.pool.free_count == CONFIG.num_blocks
        prefill.kv.pool.check_integrity()
    finally:
        prefill.close()
        store.close()
