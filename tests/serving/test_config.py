"""Validation of serving config, requests, handoffs and their protobuf mapping."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kvstore.errors import BadRequestError, NotFoundError, TooLargeError
from kvstore.model import ModelConfig, SamplingParams
from kvstore.serving import convert
from kvstore.serving.client import make_spec
from kvstore.serving.config import ServingConfig, kv_layout, namespace, parse_cpus
from kvstore.serving.request import Handoff, Request, sample_token
from kvstore.v1 import serving_pb2 as pb


@pytest.mark.parametrize(
    "bad",
    [
        {"model_id": "gpt-9"},
        {"role": "router"},
        {"on_missing": "retry"},
        {"on_finish": "keep"},
        {"block_tokens": 0},
        {"num_blocks": -1},
        {"chunk_tokens": 1.5},
        {"local_prefill_tokens": -1},
        {"tail_ttl_s": -1.0},
    ],
)
def test_config_rejects(bad: dict[str, object]) -> None:
    with pytest.raises(BadRequestError):
        ServingConfig(**bad)  # type: ignore[arg-type]


def test_layout_and_namespace_follow_the_config() -> None:
    config = ServingConfig()
    layout = kv_layout(config)
    shape = (layout.num_layers, layout.block_tokens, layout.kv_heads, layout.head_dim)
    assert shape == (4, 16, 2, 32)
    assert layout.block_bytes_per_layer == 8192
    variants = [
        config,
        replace(config, batch_invariant=False),
        replace(config, seed=1),
        replace(config, block_tokens=32),
        replace(config, model_id="small"),
    ]
    spaces = {namespace(c) for c in variants}
    assert len(spaces) == 5  # KV bytes differ, so hashes must
    assert namespace(replace(config, role="prefill")) == namespace(config)
    with pytest.raises(NotFoundError, match="serves 'tiny'"):
        config.check_model("small")


def test_parse_cpus() -> None:
    assert parse_cpus("0,2-3,7") == (0, 2, 3, 7)
    assert parse_cpus("") == ()


def test_request_limits() -> None:
    model = ModelConfig.tiny(max_position=64)
    Request("ok", (1,) * 60, 4).check_fits(model)
    with pytest.raises(TooLargeError, match="exceeds the model's context of 64"):
        Request("p", (1,) * 64, 1).check_fits(model)
    with pytest.raises(TooLargeError, match="max_tokens 5"):
        Request("m", (1,) * 60, 5).check_fits(model)
    with pytest.raises(BadRequestError, match="vocab"):
        Request("v", (260,), 1).check_fits(model)
    with pytest.raises(BadRequestError, match="request_id"):
        Request("x" * 257, (1,), 1)


def test_handoff_checks() -> None:
    h = Handoff(16, 4, (b"a" * 16, b"b" * 16), "tail/x", 5)
    assert (h.prompt_tokens, h.num_blocks) == (37, 3)
    with pytest.raises(BadRequestError):
        Handoff(16, 4, (), "tail/x", 0)  # a tail key without tail tokens
    with pytest.raises(BadRequestError):
        Handoff(16, 4, (), "tail/x", 16)  # a full block is not a tail
    assert convert.handoff_from_pb(convert.handoff_to_pb(h)) == h


def test_spec_conversion() -> None:
    text = convert.request_from_spec(make_spec("t", "hi", 3))
    assert text.prompt == (256, ord("h"), ord("i"))  # BOS + bytes
    ids = convert.request_from_spec(make_spec("i", [5, 6], 2, temperature=0.5, seed=9))
    assert ids.sampling == SamplingParams(temperature=0.5, top_p=1.0, seed=9)
    spec = make_spec("b", [5], 2)
    spec.prompt_text = "x"
    with pytest.raises(BadRequestError, match="not both"):
        convert.request_from_spec(spec)
    bare = pb.GenerationSpec(prompt_token_ids=[1], max_tokens=1)  # top_p unset -> 1.0
    assert convert.request_from_spec(bare).sampling.top_p == 1.0
    with pytest.raises(BadRequestError, match="empty prompt"):
        convert.request_from_spec(pb.GenerationSpec(max_tokens=1))


def test_sampling_per_index_is_deterministic() -> None:
    logits = torch.linspace(0, 1, 260)
    hot = SamplingParams(temperature=2.0, seed=3)
    draws = [sample_token(hot, logits, i) for i in range(32)]
    assert draws == [sample_token(hot, logits, i) for i in range(32)]
    assert len(set(draws)) > 1
    assert sample_token(SamplingParams(), logits, 5) == 259  # greedy: argmax
