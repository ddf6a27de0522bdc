"""What the conductor costs: TTFT and total time of a request through the conductor
vs the same request sent to the nodes directly (Prefill, then Decode).

One master, one storage node, one prefill node, one decode node and the conductor
(`python -m kvstore.conductor`), started by the serving bench's `Launcher`. Requests
run one at a time, alternating direct / conductor (so load drift hits both alike),
each with a fresh random prompt (no prefix hit favours either path). The conductor's
extra work: tokenizing and hashing the prompt, a MatchPrefix on the master, the
policy, and relaying every token through one more gRPC hop.

A third path, `client`, is what `kvstore generate` runs: kvstore.ConductorClient's
stream. Its TTFT (call to first text chunk, client clock) is set against the
conductor's own TTFT for the same request (`RequestTimings.ttft_s`: arrival at the
conductor to first token relayed): the client's share of the time to first token.
The target: client TTFT <= 1.2x the conductor's own, 256-token prompts.

    python bench/conductor_overhead.py [--quick] [--json] [--model tiny|small]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc

from kvstore.client.conductor import ConductorClient
from kvstore.serving.client import ServingClient, make_spec
from kvstore.serving_bench.launch import Launcher, serving_argv, storage_argv
from kvstore.v1 import conductor_pb2 as cpb
from kvstore.v1 import conductor_pb2_grpc
from kvstore.v1 import serving_pb2 as spb


@dataclass
class Samples:
    """Seconds per request of one path."""

    ttft: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    route: list[float] = field(default_factory=list)
    server_ttft: list[float] = field(default_factory=list)  # the conductor's own measure


@dataclass(frozen=True, slots=True)
class Sizes:
    requests: int
    prompt_tokens: int
    max_tokens: int
    warmup: int = 2


def start(launcher: Launcher, model: str) -> tuple[str, str, str]:
    """The cluster; returns (prefill, decode, conductor) addresses."""
    master = launcher.master()
    _, prefill, decode = launcher.start_many(
        [
            ("store-0", storage_argv(master, 64, "store-0")),
            ("prefill", serving_argv("prefill_node", model=model, master=master)),
            ("decode", serving_argv("decode_node", model=model, master=master)),
        ]
    )
    conductor = launcher.start(
        "conductor",
        ["-m", "kvstore.conductor", "--master", master, "--prefill", prefill, "--decode", decode],
    )
    return prefill, decode, conductor


def direct(client: ServingClient, spec: spb.GenerationSpec, out: Samples) -> list[int]:
    start = time.perf_counter()
    pre = client.prefill(spec)
    out.ttft.append(time.perf_counter() - start)
    tokens = [pre.first_token]
    for chunk in client.decode_stream(spec, pre):
        tokens.extend(chunk.token_ids[1:] if chunk.index == 0 else chunk.token_ids)
    out.total.append(time.perf_counter() - start)
    return tokens


def conducted(
    stub: conductor_pb2_grpc.ConductorStub, spec: spb.GenerationSpec, out: Samples
) -> list[int]:
    start = time.perf_counter()
    tokens: list[int] = []
    last = None
    for message in stub.Generate(cpb.ConductorGenerateRequest(spec=spec), timeout=120):
        if not tokens and message.token_ids:
            out.ttft.append(time.perf_counter() - start)
        tokens.extend(message.token_ids)
        last = message
    out.total.append(time.perf_counter() - start)
    assert last is not None
    out.route.append(last.timings.route_s)
    return tokens


def via_client(client: ConductorClient, spec: spb.GenerationSpec, out: Samples) -> list[int]:
    """`kvstore generate`'s path: ConductorClient.stream (token ids in, text out)."""
    start = time.perf_counter()
    tokens: list[int] = []
    timings = None
    for chunk in client.stream(list(spec.prompt_token_ids), max_tokens=spec.max_tokens):
        if not tokens and chunk.token_ids:
            out.ttft.append(time.perf_counter() - start)
        tokens.extend(chunk.token_ids)
        timings = chunk.timings or timings
    out.total.append(time.perf_counter() - start)
    assert timings is not None
    out.route.append(timings.route_s)
    out.server_ttft.append(timings.ttft_s)
    return tokens


def cli_runs(conductor: str, model: str, sizes: Sizes, runs: int) -> dict[str, float]:
    """`kvstore generate --json` as a subprocess: its own TTFT (call to first token, in
    the process) over the conductor's own TTFT for the same request, and the wall time
    of the whole process (Python start and imports included)."""
    rng = random.Random(1)
    ratios, ttfts, walls = [], [], []
    for _ in range(runs):
        prompt = "".join(chr(rng.randrange(97, 123)) for _ in range(sizes.prompt_tokens - 1))
        started = time.perf_counter()
        res = subprocess.run(
            [sys.executable, "-m", "cli.main", "generate", prompt, "--conductor", conductor,
             "--model", model, "--max-tokens", str(sizes.max_tokens), "--json"],
            capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1],
            check=True,
        )  # fmt: skip
        walls.append(time.perf_counter() - started)
        doc = json.loads(res.stdout)
        ttfts.append(doc["ttft_s"])
        ratios.append(doc["ttft_s"] / doc["conductor_ttft_s"])
    return {
        "runs": runs,
        "ttft_p50_s": p50(ttfts),
        "ttft_over_conductor_own_p50": p50(ratios),
        "process_wall_p50_s": p50(walls),
    }


def measure(addresses: tuple[str, str, str], model: str, sizes: Sizes) -> dict[str, Samples]:
    prefill, decode, conductor = addresses
    rng = random.Random(0)
    results = {"direct": Samples(), "conductor": Samples(), "client": Samples()}
    paths = ("direct", "conductor", "client")
    with (
        ServingClient(prefill=prefill, decode=decode, timeout_s=120) as client,
        grpc.insecure_channel(conductor) as channel,
        ConductorClient(conductor, model=model, deadline_s=120) as cclient,
    ):
        stub = conductor_pb2_grpc.ConductorStub(channel)
        for i in range(sizes.warmup + sizes.requests):
            keep = i >= sizes.warmup
            for path in paths[i % 3 :] + paths[: i % 3]:  # rotate the order
                prompt = [rng.randrange(1, 250) for _ in range(sizes.prompt_tokens)]
                spec = make_spec(f"{path}-{i}", prompt, sizes.max_tokens, model_id=model)
                out = results[path] if keep else Samples()
                if path == "direct":
                    got = direct(client, spec, out)
                elif path == "conductor":
                    got = conducted(stub, spec, out)
                else:
                    got = via_client(cclient, spec, out)
                assert len(got) == sizes.max_tokens, (path, len(got))
    return results


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def report(results: dict[str, Samples], sizes: Sizes, model: str) -> dict[str, object]:
    d, c, k = results["direct"], results["conductor"], results["client"]
    return {
        "bench": "conductor_overhead",
        "model": model,
        "requests": sizes.requests,
        "prompt_tokens": sizes.prompt_tokens,
        "max_tokens": sizes.max_tokens,
        "direct": {"ttft_p50_s": p50(d.ttft), "total_p50_s": p50(d.total)},
        "conductor": {
            "ttft_p50_s": p50(c.ttft),
            "total_p50_s": p50(c.total),
            "route_p50_s": p50(c.route),
        },
        "client": {
            "ttft_p50_s": p50(k.ttft),
            "total_p50_s": p50(k.total),
            "conductor_own_ttft_p50_s": p50(k.server_ttft),
        },
        # per request: the client's TTFT over the conductor's own, then the median
        "client_vs_conductor_ttft_ratio": statistics.median(
            a / b for a, b in zip(k.ttft, k.server_ttft, strict=True) if b > 0
        )
        if k.ttft
        else 0.0,
        "ttft_ratio": p50(c.ttft) / p50(d.ttft),
        "total_ratio": p50(c.total) / p50(d.total),
        "ttft_overhead_ms": (p50(c.ttft) - p50(d.ttft)) * 1000,
        "total_overhead_ms": (p50(c.total) - p50(d.total)) * 1000,
    }


def table(rep: dict[str, object]) -> str:
    d, c, k = rep["direct"], rep["conductor"], rep["client"]
    assert isinstance(d, dict) and isinstance(c, dict) and isinstance(k, dict)
    lines = [
        f"conductor overhead: {rep['requests']} requests per path, model {rep['model']}, "
        f"{rep['prompt_tokens']}-token prompts, {rep['max_tokens']} new tokens, one at a time",
        f"{'path':<10} {'TTFT p50 ms':>12} {'total p50 ms':>13} {'route p50 ms':>13}",
        f"{'direct':<10} {d['ttft_p50_s'] * 1e3:>12.2f} {d['total_p50_s'] * 1e3:>13.2f} {'-':>13}",
        f"{'conductor':<10} {c['ttft_p50_s'] * 1e3:>12.2f} {c['total_p50_s'] * 1e3:>13.2f} "
        f"{c['route_p50_s'] * 1e3:>13.2f}",
        f"{'client':<10} {k['ttft_p50_s'] * 1e3:>12.2f} {k['total_p50_s'] * 1e3:>13.2f} "
        f"{'-':>13}   (conductor's own TTFT p50 {k['conductor_own_ttft_p50_s'] * 1e3:.2f} ms)",
        f"kvstore generate path: client TTFT / conductor's own TTFT "
        f"{rep['client_vs_conductor_ttft_ratio']:.3f}x (target <= 1.2x)",
        f"ratio conductor/direct: TTFT {rep['ttft_ratio']:.3f}x "
        f"(+{rep['ttft_overhead_ms']:.2f} ms), total {rep['total_ratio']:.3f}x "
        f"(+{rep['total_overhead_ms']:.2f} ms)",
    ]
    cli = rep.get("kvstore_generate")
    if isinstance(cli, dict):
        lines.append(
            f"kvstore generate (subprocess, {cli['runs']} runs): its TTFT p50 "
            f"{cli['ttft_p50_s'] * 1e3:.2f} ms = {cli['ttft_over_conductor_own_p50']:.3f}x the "
            f"conductor's own; whole process {cli['process_wall_p50_s']:.2f} s (Python start)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (8 requests a path)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--model", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--requests", type=int, default=0, help="per path (default 40, quick 8)")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    sizes = Sizes(
        requests=args.requests or (8 if args.quick else 40),
        prompt_tokens=args.prompt_tokens,
        max_tokens=8 if args.quick else 16,
    )
    with (
        tempfile.TemporaryDirectory(prefix="conductor-bench-") as logs,
        Launcher(log_dir=logs) as launcher,
    ):
        addresses = start(launcher, args.model)
        results = measure(addresses, args.model, sizes)
        cli = cli_runs(addresses[2], args.model, sizes, 3 if args.quick else 8)
    rep = report(results, sizes, args.model)
    rep["kvstore_generate"] = cli
    print(json.dumps(rep) if args.json else table(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
