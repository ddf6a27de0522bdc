"""kvstore.config: TOML -> environment -> flags into the frozen config dataclasses."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.config import ConfigError, load
from kvstore.master.config import MasterConfig
from kvstore.node.config import NodeConfig

TOML = """\
# a comment
[master]
listen = "127.0.0.1:6000"
node_ttl_s = 20
high_watermark = 0.9

[node]
dram_bytes = 1048576
"""


def _file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "kvstore.toml"
    p.write_text(text)
    return p


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    path = _file(tmp_path, TOML)
    env = {"KVSTORE_MASTER_NODE_TTL_S": "30", "KVSTORE_MASTER_LOW_WATERMARK": "0.5"}
    eff = load(path, env).section("master", flags={"listen": "127.0.0.1:0", "db_path": None})
    cfg = eff.build()
    assert isinstance(cfg, MasterConfig)
    assert (cfg.listen, cfg.node_ttl_s, cfg.high_watermark, cfg.low_watermark) == (
        "127.0.0.1:0", 30.0, 0.9, 0.5,
    )  # fmt: skip
    assert eff.sources == {
        "listen": "flag",
        "node_ttl_s": "env KVSTORE_MASTER_NODE_TTL_S",
        "high_watermark": f"{path}:5",
        "low_watermark": "env KVSTORE_MASTER_LOW_WATERMARK",
    }
    rows = {k: (v, s) for k, v, s in eff.rows()}
    assert rows["put_timeout_s"] == (30.0, "default") and rows["listen"][1] == "flag"


def test_node_section_builds_with_a_required_master(tmp_path: Path) -> None:
    eff = load(_file(tmp_path, TOML), {}).section("node")
    cfg = eff.build(master="127.0.0.1:6000")
    assert isinstance(cfg, NodeConfig) and cfg.dram_bytes == 1 << 20


def test_unknown_key_names_the_key_and_the_line(tmp_path: Path) -> None:
    path = _file(tmp_path, "[master]\nlisten = 'x:1'\n\nnode_tll_s = 3\n")
    with pytest.raises(ConfigError, match=rf"{path}:4: unknown key 'node_tll_s' in \[master\]"):
        load(path, {})


def test_unknown_section_names_its_line(tmp_path: Path) -> None:
    path = _file(tmp_path, "[cli]\n[mastr]\nlisten = 'x:1'\n")
    with pytest.raises(ConfigError, match=rf"{path}:2: unknown section \[mastr\]"):
        load(path, {})


def test_wrong_type_in_file_env_and_flag(tmp_path: Path) -> None:
    path = _file(tmp_path, '[master]\nnode_ttl_s = "ten"\n')
    with pytest.raises(ConfigError, match=rf"{path}:2: master.node_ttl_s: 'ten' is not a float"):
        load(path, {})
    with pytest.raises(ConfigError, match=r"KVSTORE_MASTER_MAX_BATCH: '1\.5' is not a int"):
        load(None, {"KVSTORE_MASTER_MAX_BATCH": "1.5"}).section("master")
    with pytest.raises(ConfigError, match="has no setting 'bogus'"):
        load(None, {}).section("master", flags={"bogus": 1})


def test_valid_types_but_invalid_value_is_the_dataclass_error(tmp_path: Path) -> None:
    path = _file(tmp_path, "[master]\nlow_watermark = 0.99\nhigh_watermark = 0.5\n")
    with pytest.raises(ValueError, match="low_watermark <= high_watermark"):
        load(path, {}).section("master").build()


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(_file(tmp_path, "[master\n"), {})
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(tmp_path / "nope.toml", {})


def test_config_env_names_the_file(tmp_path: Path) -> None:
    path = _file(tmp_path, TOML)
    layers = load(None, {"KVSTORE_CONFIG": str(path)})
    assert layers.section("master").build().node_ttl_s == 20.0
