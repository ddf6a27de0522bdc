"""The conductor's policy code imports neither grpc nor torch (the simulator reuses it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvstore.conductor.cache_load import CacheLoadConfig
from kvstore.errors import BadRequestError


def test_conductor_imports_no_grpc_or_torch() -> None:
    code = (
        "import sys, kvstore.conductor, kvstore.conductor.planner, kvstore.conductor.replication\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cache_load_config_is_validated() -> None:
    with pytest.raises(BadRequestError, match="local_tbt_fill"):
        CacheLoadConfig(local_tbt_fill=0.0)
    with pytest.raises(BadRequestError):
        CacheLoadConfig(slack=-0.1)
