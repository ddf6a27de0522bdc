"""kvstore.config: TOML -> environment -> flags into the frozen config dataclasses."""

from __future__ import annotations

import json
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


# ---- [security] -------------------------------------------------------------


def _security_files(tmp_path: Path) -> tuple[Path, Path]:
    from kvstore.security import tokens
    from kvstore.security.identity import Identity

    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 32)
    token = tmp_path / "admin.token"
    token.write_text(tokens.issue(secret.read_bytes(), Identity("admin", "ops"), 600.0))
    return secret, token


def test_security_section_builds_with_sources(tmp_path: Path) -> None:
    from kvstore.security.config import SecurityConfig

    secret, token = _security_files(tmp_path)
    path = _file(tmp_path, f'[security]\nmode = "token"\nsecret_file = "{secret}"\n'
                           f'token_file = "{token}"\n')  # fmt: skip
    eff = load(path, {"KVSTORE_SECURITY_REVOKED_FILE": "/nonexistent/revoked"}).section("security")
    cfg = eff.build()
    assert isinstance(cfg, SecurityConfig)
    assert (cfg.mode, cfg.secret_file, cfg.token_file) == ("token", str(secret), str(token))
    assert eff.sources == {
        "mode": f"{path}:2", "secret_file": f"{path}:3", "token_file": f"{path}:4",
        "revoked_file": "env KVSTORE_SECURITY_REVOKED_FILE",
    }  # fmt: skip


def test_security_unknown_key_wrong_type_and_bad_file_name_the_line(tmp_path: Path) -> None:
    path = _file(tmp_path, '[security]\nmode = "tls"\ncert_path = "x.pem"\n')
    with pytest.raises(ConfigError, match=rf"{path}:3: unknown key 'cert_path' in \[security\]"):
        load(path, {})
    path = _file(tmp_path, "[security]\nmode = 1\n")
    with pytest.raises(ConfigError, match=rf"{path}:2: security.mode: 1 is not a str"):
        load(path, {})
    missing = tmp_path / "nope.pem"
    path = _file(tmp_path, f'[security]\n\nca_file = "{missing}"\ncert_file = "{missing}"\n'
                           f'key_file = "{missing}"\n')  # fmt: skip
    with pytest.raises(ConfigError, match=rf"{path}:3: \[security\] .* ca_file"):
        load(path, {}).section("security").build()
    path = _file(tmp_path, '[security]\nmode = "kerberos"\n')
    with pytest.raises(ConfigError, match=rf"{path}:2: \[security\] security mode 'kerberos'"):
        load(path, {}).section("security").build()


def test_apply_security_exports_the_file_and_env_wins(tmp_path: Path) -> None:
    from kvstore.config import apply_security
    from kvstore.security.config import from_env

    secret, token = _security_files(tmp_path)
    other = tmp_path / "other.token"
    other.write_text(token.read_text())
    path = _file(tmp_path, f'[security]\nsecret_file = "{secret}"\ntoken_file = "{token}"\n')
    env = {"KVSTORE_SECURITY_TOKEN_FILE": str(other)}
    cfg = apply_security(load(path, env), env)
    # the mode stays implied (not exported), the env's token file wins over the file's
    assert env == {"KVSTORE_SECURITY_TOKEN_FILE": str(other),
                   "KVSTORE_SECURITY_SECRET_FILE": str(secret)}  # fmt: skip
    assert cfg.mode == "token" and from_env(env) == cfg


def test_config_show_prints_security_with_sources_and_hides_the_token(tmp_path: Path) -> None:
    from tests.cli.procs import run

    secret, _ = _security_files(tmp_path)
    path = _file(tmp_path, f'[security]\nmode = "token"\nsecret_file = "{secret}"\n'
                           'token = "tok-very-secret"\n')  # fmt: skip
    res = run("config", "show", "security", "--config", str(path), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)["security"]
    assert doc["mode"] == {"value": "token", "source": f"{path}:2"}
    assert doc["secret_file"] == {"value": str(secret), "source": f"{path}:3"}
    assert doc["token"] == {"value": "<redacted>", "source": f"{path}:4"}
    assert doc["ca_file"] == {"value": "", "source": "default"}
    assert "tok-very-secret" not in res.stdout
    bad = _file(tmp_path, "[security]\nmode = 'token'\ntoken_fil = 'x'\n")
    res = run("config", "show", "--config", str(bad))
    assert res.returncode == 2 and f"{bad}:3: unknown key 'token_fil'" in res.stderr
    assert "Traceback" not in res.stderr


def test_master_and_admin_command_take_security_from_the_config_file(tmp_path: Path) -> None:
    """A real master started with [security] token mode refuses an admin call without a
    token and answers one whose config file names the token file."""
    from tests.cli.procs import run, service

    secret, token = _security_files(tmp_path)
    server = _file(tmp_path, f'[security]\nmode = "token"\nsecret_file = "{secret}"\n')
    client = tmp_path / "client.toml"
    client.write_text(f'[security]\ntoken_file = "{token}"\n')
    with service("master", "--listen", "127.0.0.1:0", "--config", str(server)) as (_, line):
        address = line.split("listening on ")[1].split()[0]
        ok = run(
            "tiers", "--master", address, "--config", str(client), "--json", "--timeout-s", "20"
        )
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["master"] == address
        refused = run("tiers", "--master", address, "--timeout-s", "3")
        assert refused.returncode in (4, 5), refused.stderr
        assert "Traceback" not in refused.stderr


def test_security_and_the_masters_limits_in_one_file(tmp_path: Path) -> None:
    """The trust-boundary limits are [master] settings (MasterConfig validates them);
    one kvstore.toml carries them beside [security]."""
    secret, _ = _security_files(tmp_path)
    path = _file(tmp_path, f'[security]\nmode = "token"\nsecret_file = "{secret}"\n\n'
                           '[master]\nmax_key_bytes = 512\nmax_objects = 1000\n'
                           'tenant_quotas = [["acme", 1048576]]\n')  # fmt: skip
    layers = load(path, {})
    master = layers.section("master")
    cfg = master.build()
    assert (cfg.max_key_bytes, cfg.max_objects, cfg.tenant_quotas) == (
        512,
        1000,
        (("acme", 1 << 20),),
    )
    assert master.sources["tenant_quotas"] == f"{path}:8"
    assert layers.section("security").build().mode == "token"
    bad = _file(tmp_path, "[master]\nmax_objects = 0\n")
    with pytest.raises(ConfigError, match=rf"{bad}:2: \[master\] .*max_objects"):
        load(bad, {}).section("master").build()
