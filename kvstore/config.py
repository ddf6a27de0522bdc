"""One configuration for every kvstore process: a TOML file, then environment variables,
then flags (each overrides the one before), validated into the components' own frozen
config dataclasses. Every value remembers where it came from (`kvstore config show`).

    # kvstore.toml
    [master]
    listen = "127.0.0.1:50051"
    node_ttl_s = 10.0
    [node]
    dram_bytes = 1073741824

    layers = load("kvstore.toml", env=os.environ)          # file + KVSTORE_MASTER_NODE_TTL_S=...
    eff = layers.section("master", flags={"listen": "127.0.0.1:0"})
    eff.build()        # MasterConfig(...), validated by its __post_init__
    eff.sources        # {"listen": "flag", "node_ttl_s": "kvstore.toml:4", ...}

    [security]                      # kvstore.security.config.SecurityConfig
    mode = "tls"                    # insecure | tls | token ("" = implied by the files)
    ca_file = "ca.pem"
    cert_file = "node.pem"
    key_file = "node.key"
    # token_file / secret_file / revoked_file / server_name; `config show` hides `token`

[security] applies to every process started with the file (`apply_security` exports it
as KVSTORE_SECURITY_* variables, which every server and channel reads). The limits the
master enforces (max_key_bytes, max_batch, max_objects, tenant_quota_bytes, ...) are
[master] keys: MasterConfig validates them.

A section is named after its component (`SECTIONS`); its keys are the dataclass's
fields. An environment variable is KVSTORE_<SECTION>_<FIELD> in upper case. An unknown
section or key, or a value of the wrong type, is a `ConfigError` (a BadRequestError)
naming the key and the file line; nothing starts with a half-read configuration.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstore.errors import BadRequestError

ENV_PREFIX = "KVSTORE_"
CONFIG_ENV = "KVSTORE_CONFIG"  # the file to read when no --config is given


class ConfigError(BadRequestError):
    """A configuration file, variable or flag that cannot be used as given."""


@dataclass(frozen=True, slots=True)
class CliConfig:
    """What the admin commands talk to."""

    master: str = "127.0.0.1:50051"
    conductor: str = "127.0.0.1:7000"
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ConfigError(f"cli.timeout_s must be > 0, got {self.timeout_s}")


# section -> "module:Class" (imported on first use: the CLI must start fast).
SECTIONS: dict[str, str] = {
    "cli": "kvstore.config:CliConfig",
    "master": "kvstore.master.config:MasterConfig",
    "node": "kvstore.node.config:NodeConfig",
    "conductor": "kvstore.conductor.service_config:ConductorConfig",
    "up": "cli.up:UpConfig",
    "security": "kvstore.security.config:SecurityConfig",
}
# Fields that are objects, not settings (credentials are passed in code).
_NOT_SETTINGS = {"credentials"}
# Values never printed by `kvstore config show` (a secret in the file or environment).
SECRET_FIELDS = {("security", "token")}


def section_class(name: str) -> type:
    path = SECTIONS.get(name)
    if path is None:
        raise ConfigError(f"unknown config section [{name}]; valid: {', '.join(sorted(SECTIONS))}")
    module, _, cls = path.partition(":")
    return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


def settings(cls: type) -> dict[str, Any]:
    """field name -> its resolved type, for the settable fields of a config dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name not in _NOT_SETTINGS}


# ---- values and their types -------------------------------------------------


def _kind(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(value: Any, tp: Any, where: str) -> Any:
    """`value` as type `tp` (int, float, str, bool, X | None, tuple[...]); ConfigError else."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{where}: {value!r} is not a {_kind(tp)}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: {value!r} is not a list (want {_kind(tp)})")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(coerce(v, args[0], where) for v in value)
        if len(args) != len(value):
            raise ConfigError(f"{where}: {value!r} needs {len(args)} items")
        return tuple(coerce(v, a, where) for v, a in zip(value, args, strict=True))
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is object or tp is Any:
        return value
    raise ConfigError(f"{where}: {value!r} is not a {_kind(tp)}")


def parse_text(text: str, tp: Any, where: str) -> Any:
    """A value given as text (environment variable, `--set`) as type `tp`: numbers and
    booleans as written, lists as JSON, `none` for None, anything else as a string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        candidate: Any = low == "true"
    elif low in ("none", "null"):
        candidate = None
    else:
        try:
            candidate = json.loads(text)
        except ValueError:
            candidate = text
    try:
        return coerce(candidate, tp, where)
    except ConfigError:
        if not isinstance(candidate, str):
            return coerce(text, tp, where)  # e.g. a str field given "123"
        raise


# ---- the layers -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Effective:
    """One section's values after the file, the environment and the flags, with sources."""

    section: str
    values: dict[str, Any]
    sources: dict[str, str]

    def build(self, **required: Any) -> Any:
        """The section's dataclass, validated; `required` fills fields without a default
        that no layer set (e.g. a node's master address)."""
        cls = section_class(self.section)
        kwargs = {**required, **self.values}
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"[{self.section}]: {exc}") from None
        except BadRequestError as exc:
            if isinstance(exc, ConfigError):
                raise
            # name where the offending value came from (a file line, a variable)
            named = [k for k in self.values if re.search(rf"\b{k}\b", str(exc))]
            if not named:
                raise
            raise ConfigError(f"{self.sources[named[0]]}: [{self.section}] {exc}") from None

    def rows(self) -> list[tuple[str, Any, str]]:
        """(key, value, source) for every setting; defaults included."""
        cls = section_class(self.section)
        out = []
        for f in dataclasses.fields(cls):
            if f.name in _NOT_SETTINGS:
                continue
            if f.name in self.values:
                out.append((f.name, self.values[f.name], self.sources[f.name]))
            elif f.default is not dataclasses.MISSING:
                out.append((f.name, f.default, "default"))
            elif f.default_factory is not dataclasses.MISSING:
                out.append((f.name, f.default_factory(), "default"))
            else:
                out.append((f.name, None, "required (unset)"))
        return out


@dataclass(frozen=True, slots=True)
class Layers:
    """The parsed file (section -> key -> (value, line)) and the environment."""

    path: str = ""
    file: dict[str, dict[str, tuple[Any, int]]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)

    def section(self, name: str, flags: Mapping[str, Any] | None = None) -> Effective:
        """`name`'s values: file, then KVSTORE_<NAME>_<KEY>, then `flags` (None skipped)."""
        types_ = settings(section_class(name))
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for key, (value, line) in self.file.get(name, {}).items():
            values[key] = value
            sources[key] = f"{self.path}:{line}"
        for key, tp in types_.items():
            var = f"{ENV_PREFIX}{name}_{key}".upper()
            if var in self.env:
                values[key] = parse_text(self.env[var], tp, f"environment {var}")
                sources[key] = f"env {var}"
        for key, value in (flags or {}).items():
            if value is None:
                continue
            if key not in types_:
                raise ConfigError(f"[{name}] has no setting {key!r}")
            values[key] = coerce(value, types_[key], f"flag for {name}.{key}")
            sources[key] = "flag"
        return Effective(name, values, sources)


def load(path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None) -> Layers:
    """Read and check a TOML file (None: $KVSTORE_CONFIG, if set; else none)."""
    env = dict(os.environ if env is None else env)
    path = path or env.get(CONFIG_ENV) or None
    if path is None:
        return Layers("", {}, env)
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(p)!r}: {exc.strerror}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return Layers(str(p), _check(doc, text, str(p)), env)


def apply_security(layers: Layers, environ: dict[str, str] | None = None) -> Any:
    """The effective [security] section (the file, then KVSTORE_SECURITY_* variables),
    checked (files exist, the mode fits them); the values the file set are exported as
    KVSTORE_SECURITY_* variables into `environ` (default: this process's), which every
    server and channel of this process and its children read (security.config.from_env).
    Only what a layer set is exported: a mode implied from the files stays implied."""
    eff = layers.section("security")
    security = eff.build()
    target = os.environ if environ is None else environ
    for key, value in eff.values.items():
        var = f"{ENV_PREFIX}security_{key}".upper()
        if not eff.sources[key].startswith("env ") and value:
            target[var] = str(value)
    return security


def _check(doc: dict[str, Any], text: str, path: str) -> dict[str, dict[str, tuple[Any, int]]]:
    lines = _key_lines(text)
    out: dict[str, dict[str, tuple[Any, int]]] = {}
    for name, table in doc.items():
        if not isinstance(table, dict):
            line = lines.get(("", name), 0)
            raise ConfigError(f"{path}:{line}: {name!r} must be a [section] table")
        if name not in SECTIONS:
            line = lines.get(("", f"[{name}]"), 0)
            raise ConfigError(
                f"{path}:{line}: unknown section [{name}]; valid: {', '.join(sorted(SECTIONS))}"
            )
        types_ = settings(section_class(name))
        out[name] = {}
        for key, value in table.items():
            line = lines.get((name, key), 0)
            if key not in types_:
                raise ConfigError(
                    f"{path}:{line}: unknown key {key!r} in [{name}]; valid: "
                    f"{', '.join(sorted(types_))}"
                )
            out[name][key] = (coerce(value, types_[key], f"{path}:{line}: {name}.{key}"), line)
    return out


_SECTION = re.compile(r"^\s*\[\s*([A-Za-z0-9_.-]+)\s*\]")
_KEY = re.compile(r"""^\s*("?)([A-Za-z0-9_-]+)\1\s*=""")


def _key_lines(text: str) -> dict[tuple[str, str], int]:
    """(section, key) -> 1-based line of its definition; ("", "[name]") for a header."""
    where: dict[tuple[str, str], int] = {}
    section = ""
    for n, line in enumerate(text.splitlines(), start=1):
        if m := _SECTION.match(line):
            section = m.group(1)
            where.setdefault(("", f"[{section}]"), n)
        elif m := _KEY.match(line):
            where.setdefault((section, m.group(2)), n)
    return where
