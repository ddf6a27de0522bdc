"""Benchmark: a second vLLM engine's TTFT with the prompt's prefix from kvstore vs
recomputing it, for vLLM's own MooncakeStoreConnector (on kvstore's facade) and for
kvstore's native KVStoreConnector, measured in the same run.

For each connector: a writer engine prefills every prompt (and saves its KV to the
pool); a fresh reader engine gets the same prompts and loads the prefix. The
baseline is a fresh engine without a connector (it recomputes every prompt). Each
engine first runs a short warm-up prompt; TTFT is the generate() time of one
output token. Model: a random HF Llama (8 layers, hidden 1024, float32), big
enough that prefilling 2,048 tokens takes >= 1 s here. Target: reader TTFT
<= 0.5x recompute at 2,048 tokens, for both connectors.

    python bench/engines_ttft.py [--quick] [--lengths 512,2048,4000]

Writes bench/out/engines_ttft.json and .png; prints a table. Needs .venv-vllm
(tests/integrations/venvs.sh vllm).
"""

from __future__ import annotations

import argparse
import atexit
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster import Cluster  # noqa: E402
from tests.integrations import engines  # noqa: E402

OUT = REPO / "bench" / "out"
CONNECTORS = ("MooncakeStoreConnector", "KVStoreConnector")


def prompts(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 1000) for _ in range(n)] for n in lengths]


def run_engine(py: Path, model: Path, connector: str, plist: list[list[int]], env: dict[str, str],
               log: Path, max_len: int) -> tuple[list[float], list[int]]:  # fmt: skip
    warm = prompts([64], seed=99)
    res = engines.generate(py, model, connector, warm + plist, env, log, max_tokens=1,
                           extra=["--max-model-len", str(max_len)])  # fmt: skip
    rows = res["results"][1:]
    return [r["wall_s"] for r in rows], [r["num_cached_tokens"] for r in rows]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="native connector, 512 tokens, tiny model")
    ap.add_argument("--lengths", default="512,2048,4000")
    args = ap.parse_args(argv)
    py = engines.vllm_python()
    if py is None:
        print(engines.NO_VLLM)
        return 2
    lengths = [512] if args.quick else [int(x) for x in args.lengths.split(",")]
    spec = engines.ModelSpec(layers=2, hidden=128) if args.quick else engines.ModelSpec(
        layers=8, hidden=1024)  # fmt: skip
    connectors = ("KVStoreConnector",) if args.quick else CONNECTORS
    max_len = max(lengths) + 64
    work = Path(tempfile.mkdtemp(prefix="kvs-ttft-"))
    atexit.register(shutil.rmtree, work, True)  # model, pool and logs: nothing left behind
    model = engines.make_model(py, work / "model", spec)
    plist = prompts(lengths, seed=1)
    result: dict[str, object] = {"lengths": lengths, "model": spec.__dict__, "quick": args.quick}
    t0 = time.time()
    (work / "pool").mkdir()
    with Cluster(nodes=1, dram_bytes=2 << 30, workdir=work / "pool") as pool:
        env = engines.engine_env(pool.address, work)
        base, _ = run_engine(py, model, "none", plist, env, work / "baseline.log", max_len)
        result["recompute_s"] = base
        for conn in connectors:
            cp = prompts(lengths, seed=1 + CONNECTORS.index(conn) * 7)  # own keys per connector
            write, _ = run_engine(py, model, conn, cp, env, work / f"{conn}-writer.log", max_len)
            read, cached = run_engine(py, model, conn, cp, env, work / f"{conn}-reader.log",
                                      max_len)  # fmt: skip
            result[conn] = {"writer_s": write, "reader_s": read, "cached_tokens": cached,
                            "ratio": [r / b for r, b in zip(read, base, strict=True)]}  # fmt: skip
    result["wall_s"] = time.time() - t0
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "engines_ttft.json").write_text(json.dumps(result, indent=1))
    _table(result, connectors)
    _plot(result, connectors)
    return 0


def _table(result: dict, connectors: tuple[str, ...]) -> None:
    print(f"{'connector':<24}{'tokens':>8}{'recompute s':>13}{'reader s':>10}{'cached':>8}"
          f"{'ratio':>8}")  # fmt: skip
    for conn in connectors:
        r = result[conn]
        for i, n in enumerate(result["lengths"]):
            print(f"{conn:<24}{n:>8}{result['recompute_s'][i]:>13.3f}{r['reader_s'][i]:>10.3f}"
                  f"{r['cached_tokens'][i]:>8}{r['ratio'][i]:>8.2f}")  # fmt: skip


def _plot(result: dict, connectors: tuple[str, ...]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(result["lengths"], result["recompute_s"], "o-", label="recompute (no connector)")
    for conn in connectors:
        ax.plot(result["lengths"], result[conn]["reader_s"], "o-", label=f"from kvstore: {conn}")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("second engine TTFT (s)")
    ax.set_title("vLLM-CPU TTFT: prefix from kvstore vs recompute")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "engines_ttft.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
