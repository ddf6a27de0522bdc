"""`kvstore generate "PROMPT"` and `kvstore chat`: send prompts to the conductor and
stream the text back as it comes (kvstore.ConductorClient).

    kvstore generate "Hello" [--conductor 127.0.0.1:7000] [--model tiny] [--max-tokens 32]
        [--temperature 0.7 --top-p 0.9 --seed 1] [--tenant T] [--deadline-s 60] [--stats]
    kvstore chat [--conductor ...]      # one line of stdin per turn; history is the prompt

`--stats` prints TTFT, TBT and the placement to stderr after each reply (stdout stays
the text); `--json` prints one document per reply instead of streaming.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cli.common import base_parent, cli_settings
from cli.errors import guarded


def register(sub: argparse._SubParsersAction) -> None:
    parent = argparse.ArgumentParser(add_help=False, parents=[base_parent()])
    add = parent.add_argument
    add("--conductor", default=None, help="HOST:PORT of the conductor (127.0.0.1:7000)")
    add("--model", default="tiny")
    add("--max-tokens", type=int, default=32)
    add("--temperature", type=float, default=0.0, help="0 = greedy")
    add("--top-p", type=float, default=1.0)
    add("--seed", type=int, default=0, help="sampling seed")
    add("--policy", default="", help="placement policy (default: the conductor's)")
    add("--tenant", default="")
    add("--deadline-s", type=float, default=60.0, help="bound on each whole reply")
    add("--stats", action="store_true", help="TTFT / TBT / placement on stderr")
    add("--json", action="store_true", help="one JSON document per reply")
    p = sub.add_parser("generate", help="send one prompt, stream the reply", parents=[parent])
    p.add_argument("prompt")
    p.set_defaults(handler=guarded("kvstore generate", run_generate))
    p = sub.add_parser("chat", help="multi-turn chat from stdin", parents=[parent])
    p.set_defaults(handler=guarded("kvstore chat", run_chat))


def _client(args: argparse.Namespace) -> Any:
    from kvstore.client.conductor import ConductorClient, Sampling

    cfg = cli_settings(args)
    sampling = Sampling(args.temperature, args.top_p, args.seed)
    return ConductorClient(
        cfg.conductor, model=args.model, max_tokens=args.max_tokens, sampling=sampling,
        policy=args.policy, tenant=args.tenant, deadline_s=args.deadline_s,
    )  # fmt: skip


def reply(client: Any, prompt: str, args: argparse.Namespace) -> Any:
    """Stream one reply to stdout (or collect it for --json); the Generation."""
    from kvstore.client.conductor import Generation

    out = Generation()
    for chunk in client.stream(prompt):
        out.add(chunk)
        if not args.json:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    if args.json:
        print(json.dumps(document(out)))
    else:
        print()
    if args.stats:
        print(stats_line(out), file=sys.stderr, flush=True)
    return out


def document(g: Any) -> dict[str, Any]:
    p = g.placement
    return {
        "text": g.text, "token_ids": g.token_ids, "finish": g.finish,
        "ttft_s": g.ttft_s, "tbt_s": g.tbt_s,
        "placement": None if p is None else {
            "policy": p.policy, "prefill_node": p.prefill_node, "decode_node": p.decode_node,
            "local_prefill": p.local_prefill, "cached_blocks": p.cached_blocks,
        },
        "conductor_ttft_s": g.timings.ttft_s if g.timings is not None else None,
    }  # fmt: skip


def stats_line(g: Any) -> str:
    p = g.placement
    where = ""
    if p is not None:
        mode = "local prefill" if p.local_prefill else f"prefill {p.prefill_node}"
        where = f"; {mode}, decode {p.decode_node}, {p.cached_blocks} cached blocks"
    server = f" (conductor {g.timings.ttft_s * 1000:.1f} ms)" if g.timings is not None else ""
    return (
        f"ttft {g.ttft_s * 1000:.1f} ms{server}  tbt {g.tbt_s * 1000:.1f} ms  "
        f"{len(g.token_ids)} tokens, {g.finish or 'unfinished'}{where}"
    )


def run_generate(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply(client, args.prompt, args)
    return 0


def run_chat(args: argparse.Namespace) -> int:
    """Each stdin line is a user turn; the prompt is the whole conversation so far, so
    every turn's prefix is already in the pool."""
    history = ""
    interactive = sys.stdin.isatty()
    with _client(args) as client:
        while True:
            if interactive:
                print("> ", end="", flush=True)
            line = sys.stdin.readline()
            if not line or line.strip() in ("/quit", "/exit"):
                return 0
            if not line.strip():
                continue
            history += f"user: {line.strip()}\nassistant: "
            out = reply(client, history, args)
            history += out.text + "\n"
