"""One vLLM engine run, for the two-engine tests (run with the vLLM venv's python).

    python tests/integrations/vllm_engine.py make-model DIR [--layers N --hidden H]
    python tests/integrations/vllm_engine.py generate --model DIR --connector NAME \\
        --prompts JSON [--max-tokens N] [--kv-events tcp://127.0.0.1:PORT]

`make-model` writes a random HF Llama (safetensors + config, no tokenizer) with a
fixed seed. `generate` runs greedy decoding on token-id prompts with the named KV
connector ("MooncakeStoreConnector" through kvstore's mooncake.store shim, or
"KVStoreConnector" from kvstore.integrations.vllm, or "none") and prints one line
`RESULT {json}`: per prompt the output token ids, num_cached_tokens and the time to
its first token. Environment (set by the test): MOONCAKE_CONFIG_PATH, KVSTORE_MASTER,
VLLM_CPU_KVCACHE_SPACE, PYTHONPATH with the shim first.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def make_model(out: str, layers: int, hidden: int, vocab: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    heads = max(1, hidden // 64)  # head_dim 64: one the CPU attention backend has
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2), max_position_embeddings=4096,
        torch_dtype="bfloat16", tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)


def _transfer_config(connector: str) -> Any:
    from vllm.config import KVTransferConfig

    if connector == "none":
        return None
    if connector == "KVStoreConnector":
        return KVTransferConfig(
            kv_connector="KVStoreConnector", kv_role="kv_both",
            kv_connector_module_path="kvstore.integrations.vllm",
            kv_load_failure_policy="recompute",
        )  # fmt: skip
    return KVTransferConfig(kv_connector=connector, kv_role="kv_both")


def generate(args: argparse.Namespace) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    extra: dict[str, Any] = {}
    if args.kv_events:
        from vllm.config import KVEventsConfig

        extra["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=args.kv_events,
            replay_endpoint=args.kv_events_replay or None, topic="kv-events",
        )  # fmt: skip
    t0 = time.perf_counter()
    llm = LLM(
        model=args.model, skip_tokenizer_init=True, enforce_eager=True, block_size=32,
        max_model_len=args.max_model_len, max_num_batched_tokens=args.max_model_len,
        kv_transfer_config=_transfer_config(args.connector), dtype=args.dtype,
        enable_prefix_caching=True, seed=0, **extra,
    )  # fmt: skip
    start_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, detokenize=False)
    results = []
    for ids in json.loads(args.prompts):  # one at a time: TTFT per prompt
        t = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
        wall = time.perf_counter() - t
        metrics = getattr(out, "metrics", None)
        ttft = _ttft(metrics)
        results.append({
            "tokens": list(out.outputs[0].token_ids),
            "num_cached_tokens": int(out.num_cached_tokens or 0),
            "ttft_s": ttft if ttft is not None else wall, "wall_s": wall,
        })  # fmt: skip
    return {"start_s": start_s, "results": results}


def _ttft(metrics: Any) -> float | None:
    for name in ("first_token_latency", "time_to_first_token"):
        value = getattr(metrics, name, None)
        if isinstance(value, int | float) and value > 0:
            return float(value)
    return None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-model")
    m.add_argument("out")
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--hidden", type=int, default=128)
    m.add_argument("--vocab", type=int, default=1024)
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True)
    g.add_argument("--connector", default="MooncakeStoreConnector")
    g.add_argument("--prompts", required=True)
    g.add_argument("--max-tokens", type=int, default=8)
    g.add_argument("--max-model-len", type=int, default=1024)
    g.add_argument("--dtype", default="float32", help="bfloat16 hits an illegal instruction here")
    g.add_argument("--kv-events", default="")
    g.add_argument("--kv-events-replay", default="")
    g.add_argument("--hold", action="store_true", help="after RESULT, run until stdin closes")
    args = ap.parse_args(argv)
    if args.cmd == "make-model":
        make_model(args.out, args.layers, args.hidden, args.vocab)
        return 0
    print("RESULT " + json.dumps(generate(args)), flush=True)
    if args.hold:  # keep the engine (and the segment it lent) alive until the test is done
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
