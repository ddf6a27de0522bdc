"""A fresh clone of the committed HEAD, with nothing beside it, runs the README's two
commands: `make demo` in full, and `make test` on a subset (the full suite runs in CI)
chosen with PYTEST_ADDOPTS, including the test that once needed ../shared/data.

The clone gets its own virtual environment (system site packages visible, so nothing
is downloaded but the build backend) with PY=<venv python>: `make setup`'s editable
install then points into the clone without touching this checkout's install.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SUBSET = "tests/conductor/test_latency.py tests/test_hashing.py tests/test_config.py"


def _clean_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVSTORE_", "PYTEST_"))}
    env.pop("PYTHONPATH", None)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert res.returncode == 0, (
        f"{cmd}: exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    )
    return res.stdout


def test_fresh_clone_runs_make_demo_and_make_test(tmp_path: Path) -> None:
    clone = tmp_path / "kvstore"  # alone in its directory: no ../shared beside it
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kvstore"]
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120
    )
    env = _clean_env(venv)
    py = f"PY={venv / 'bin' / 'python'}"
    demo = _run(["make", "demo", py], clone, env, 600)
    assert "18/18 ok" in demo and "shutdown: clean; 0 shared-memory segments left" in demo
    env["PYTEST_ADDOPTS"] = f"-p no:cacheprovider {SUBSET}"
    out = _run(["make", "test", py], clone, env, 600)
    assert " passed" in out and " failed" not in out
    where = _run(
        [str(venv / "bin" / "python"), "-c", "import kvstore, sys; print(kvstore.__file__)"],
        venv, env, 60,  # not tmp_path: there the clone's folder "kvstore" would shadow it
    )  # fmt: skip
    assert where.strip().startswith(str(clone))  # the clone's own code ran
