"""Running real vLLM engines (in their own venv) against a kvstore pool, for tests and benches.

The venv is `.venv-vllm/` at the repository root (built by tests/integrations/venvs.sh,
which .ci/run calls) or the python named by $KVSTORE_VLLM_PYTHON. Without it the
tests skip, saying so. Each engine is one child process running vllm_engine.py; its
output goes to a log file (shown when it fails); it is killed at its deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstore.compat.shim import SHIM_DIR

REPO = Path(__file__).resolve().parents[2]
ENGINE = Path(__file__).resolve().parent / "vllm_engine.py"
ENGINE_TIMEOUT_S = 420.0  # an engine start on 2 shared cores takes ~60 s; a loaded CI more
BLOCK = 32


def vllm_python() -> Path | None:
    """The vLLM venv's python, or None when it is not built."""
    named = os.environ.get("KVSTORE_VLLM_PYTHON", "")
    path = Path(named) if named else REPO / ".venv-vllm" / "bin" / "python"
    return path if path.exists() else None


NO_VLLM = "vLLM venv absent: build it with tests/integrations/venvs.sh vllm (CI does)"


@dataclass(frozen=True)
class ModelSpec:
    layers: int = 2
    hidden: int = 128
    vocab: int = 1024

    @property
    def kv_heads(self) -> int:
        return max(1, max(1, self.hidden // 64) // 2)

    def block_bytes(self, dtype_bytes: int = 4) -> int:
        """KV bytes of one 32-token block over all layers (K and V, head_dim 64)."""
        return 2 * self.layers * BLOCK * self.kv_heads * 64 * dtype_bytes


def make_model(python: Path, out: Path, spec: ModelSpec) -> Path:
    args = ["make-model", str(out), "--layers", str(spec.layers), "--hidden", str(spec.hidden),
            "--vocab", str(spec.vocab)]  # fmt: skip
    _run(python, args, dict(os.environ), out.parent / "make-model.log", 300.0)
    return out


def engine_env(master: str, workdir: Path, mode: str = "standalone-store",
               segment: str = "0") -> dict[str, str]:  # fmt: skip
    """Environment of an engine: the shim first on PYTHONPATH, a Mooncake config on
    `master` (standalone-store: the engine lends nothing, objects live on storage nodes)."""
    config = workdir / f"mooncake-{mode}.json"
    config.write_text(json.dumps({
        "metadata_server": "P2PHANDSHAKE", "master_server_address": master,
        "protocol": "tcp", "device_name": "", "mode": mode,
        "global_segment_size": segment, "local_buffer_size": "64MB",
    }))  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SHIM_DIR), str(REPO), env.get("PYTHONPATH", "")) if p
    )
    env.update({"MOONCAKE_CONFIG_PATH": str(config), "KVSTORE_MASTER": master,
                "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONFAULTHANDLER": "1",
                "MC_TCP_BIND_ADDRESS": "127.0.0.1"})  # fmt: skip
    return env


def generate(python: Path, model: Path, connector: str, prompts: list[list[int]],
             env: dict[str, str], log: Path, max_tokens: int = 8,
             extra: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """One engine process: greedy outputs of `prompts`, one at a time; its RESULT dict."""
    args = ["generate", "--model", str(model), "--connector", connector, "--prompts",
            json.dumps(prompts), "--max-tokens", str(max_tokens), *(extra or [])]  # fmt: skip
    return _run(python, args, env, log, ENGINE_TIMEOUT_S)


def _run(python: Path, args: list[str], env: dict[str, str], log: Path,
         timeout_s: float) -> dict[str, Any]:  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(python), str(ENGINE), *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=log.parent,
                                start_new_session=True)  # fmt: skip
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise AssertionError(f"engine past {timeout_s} s; log {log}:\n{_tail(log)}") from None
        finally:
            kill_group(proc)  # an engine's EngineCore/Worker children must not outlive it
    if code != 0:
        raise AssertionError(f"engine exited {code}; log {log}:\n{_tail(log)}")
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    return {}


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the engine's whole session (it was started with start_new_session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(log: Path, n: int = 60) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
