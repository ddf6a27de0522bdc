"""LMCache's Mooncake backend on kvstore, and kvstore at its dependency floor.

In the LMCache venv (tests/integrations/venvs.sh: LMCache 0.5.6, protobuf 6.31.1,
grpcio 1.78.0, the oldest kvstore claims) the pool itself (master and node processes
started with that venv's python) serves LMCache's own `MooncakestoreConnector`
through kvstore's mooncake.store shim, in both of its modes: save_chunk_meta true
(put_parts + batch_get_buffer, metadata stored with the chunk) and false
(batch_put_from + batch_get_into, zero-copy).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvstore.compat.shim import SHIM_DIR
from tests.cluster import REPO, Cluster

VENV_PY = Path(os.environ.get("KVSTORE_LMCACHE_PYTHON", REPO / ".venv-lmcache/bin/python"))
DRIVER = Path(__file__).resolve().parent / "lmcache_driver.py"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not VENV_PY.exists(), reason="LMCache venv absent: build it with "
                       "tests/integrations/venvs.sh lmcache (CI does)"),
]  # fmt: skip


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM_DIR), str(REPO)])
    return env


def test_kvstore_imports_at_the_floor() -> None:
    code = ("import google.protobuf, grpc, kvstore.client, kvstore.master.server, "
            "kvstore.v1.conductor_pb2_grpc, kvstore.v1.serving_pb2_grpc; "
            "print(google.protobuf.__version__, grpc.__version__)")  # fmt: skip
    out = subprocess.run([str(VENV_PY), "-c", code], env=_env({}), capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["6.31.1", "1.78.0"]


@pytest.mark.parametrize("save_chunk_meta", ["true", "false"])
def test_lmcache_mooncake_backend_round_trip(save_chunk_meta: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr("sys.executable", str(VENV_PY))  # the pool runs at the floor too
    with Cluster(nodes=1, dram_bytes=64 << 20, workdir=tmp_path) as pool:
        config = tmp_path / "mooncake.json"
        config.write_text(json.dumps({
            "local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
            "protocol": "tcp", "device_name": "", "master_server_address": pool.address,
            "global_segment_size": 0, "local_buffer_size": 64 << 20,
        }))  # fmt: skip
        out = subprocess.run([str(VENV_PY), str(DRIVER), "--save-chunk-meta", save_chunk_meta],
                             env=_env({"MOONCAKE_CONFIG_PATH": str(config)}),
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
        assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
        line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
        result = json.loads(line[len("RESULT ") :])
        stats = pool.stats()
    assert result["store_module"] == "kvstore.compat.mooncake"
    assert result["save_chunk_meta"] is (save_chunk_meta == "true")
    assert result["exists"] == [True] * 4 + [False] and result["contains"] == 4
    assert result["exact"] == [True] * 4 and result["missing_is_none"]
    assert stats.complete == 4
