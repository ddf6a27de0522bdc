"""The conductor's policy code imports neither grpc nor torch (the simulator reuses it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvstore.conductor import identity
from kvstore.conductor.cache_load import CacheLoadConfig
from kvstore.errors import BadRequestError

POLICY_MODULES = (
    "kvstore.conductor",
    "kvstore.conductor.api",
    "kvstore.conductor.base",
    "kvstore.conductor.cache_load",
    "kvstore.conductor.flexible",
    "kvstore.conductor.hardware",
    "kvstore.conductor.identity",
    "kvstore.conductor.ledger",
    "kvstore.conductor.planner",
    "kvstore.conductor.profiles",
    "kvstore.conductor.replication",
    "kvstore.conductor.roles",
    "kvstore.conductor.service_config",
    "kvstore.sim",
    "kvstore.sim.cluster",
    "kvstore.sim.placement",
    "kvstore.sim.replay",
    "kvstore.sim.search",
)


def test_policy_modules_and_simulator_import_no_grpc_or_torch() -> None:
    # a fresh interpreter: this one has grpc and torch loaded by other tests
    code = (
        "import importlib, sys\n"
        f"for m in {POLICY_MODULES!r}: importlib.import_module(m)\n"
        "from kvstore.conductor.identity import KeyIdentity\n"
        "KeyIdentity('tiny', 0, True, 4, 16, 'layer', 'float32').hashes(list(range(40)))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_namespace_without_torch_equals_the_serving_nodes() -> None:
    from kvstore.serving.config import ServingConfig, namespace

    for cfg in (
        ServingConfig(),
        ServingConfig("small", seed=7, block_tokens=32, batch_invariant=False),
    ):
        ours = identity.namespace(
            cfg.model_id, cfg.seed, cfg.block_tokens, cfg.batch_invariant, cfg.model.dtype
        )
        assert ours == namespace(cfg)


def test_conductor_modules_import_each_other_without_a_cycle() -> None:
    # nodes (the node model) is imported by plan, service and server; none of them by it
    import ast
    from pathlib import Path

    root = Path(identity.__file__).parent
    imports: dict[str, set[str]] = {}
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        found = {
            n.module.rsplit(".", 1)[-1]
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("kvstore.conductor.")
        }
        imports[path.stem] = found
    for start in imports:
        seen, todo = set(), list(imports[start])
        while todo:
            mod = todo.pop()
            assert mod != start, f"import cycle through kvstore.conductor.{start}"
            if mod not in seen:
                seen.add(mod)
                todo.extend(imports.get(mod, ()))


def test_cache_load_config_is_validated() -> None:
    with pytest.raises(BadRequestError, match="local_tbt_fill"):
        CacheLoadConfig(local_tbt_fill=0.0)
    with pytest.raises(BadRequestError):
        CacheLoadConfig(slack=-0.1)
