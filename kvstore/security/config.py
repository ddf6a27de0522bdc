"""Security settings of one process: a frozen dataclass, from code, the [security] section
of a kvstore.toml, or KVSTORE_SECURITY_<FIELD> variables (kvstore.config's layering).

    mode "insecure"  no credential at all (development; every server warns at start)
    mode "tls"       mutual TLS: `cert_file`/`key_file` are this process's identity (server
                     side and client side), `ca_file` the CA that signs every peer
    mode "token"     one host: gRPC local credentials (loopback only) plus a bearer token
                     (`token_file`) that the servers check with `secret_file`
    mode ""          chosen from what is set: a cert -> tls, a token or secret -> token

`revoked_file` (servers): certificate fingerprints (sha256 of the DER, hex) or token ids,
one per line, refused even while otherwise valid; re-read when the file changes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from kvstore.errors import BadRequestError

MODES = ("insecure", "tls", "token")
ENV_PREFIX = "KVSTORE_SECURITY_"


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """How this process proves who it is, and how its servers check callers."""

    mode: str = ""
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    token_file: str = ""
    token: str = ""  # the token itself (prefer token_file: a variable leaks into children)
    secret_file: str = ""
    revoked_file: str = ""
    server_name: str = ""  # TLS: the name to expect in servers' certificates ("" = host)

    def __post_init__(self) -> None:
        if self.mode not in ("", *MODES):
            raise BadRequestError(f"security mode {self.mode!r}: want one of {', '.join(MODES)}")
        if not self.mode:
            object.__setattr__(self, "mode", self._implied_mode())
        if self.mode == "tls" and not (self.ca_file and self.cert_file and self.key_file):
            raise BadRequestError("security mode tls needs ca_file, cert_file and key_file")
        for name in ("ca_file", "cert_file", "key_file", "token_file", "secret_file"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise BadRequestError(f"security {name} {path!r} is not a file")

    def _implied_mode(self) -> str:
        if self.cert_file or self.key_file:
            return "tls"
        if self.token or self.token_file or self.secret_file:
            return "token"
        return "insecure"

    @property
    def insecure(self) -> bool:
        return self.mode == "insecure"

    def client_token(self) -> str:
        """The bearer token this process presents ("" when it has none)."""
        if self.token:
            return self.token.strip()
        if self.token_file:
            with open(self.token_file) as f:
                return f.read().strip()
        return ""

    def secret(self) -> bytes:
        """The HMAC secret servers check tokens with (BadRequestError without one)."""
        if not self.secret_file:
            raise BadRequestError("security mode token: a server needs secret_file")
        with open(self.secret_file, "rb") as f:
            secret = f.read().strip()
        if len(secret) < 16:
            raise BadRequestError(f"secret_file {self.secret_file!r}: want >= 16 bytes")
        return secret


def from_env(env: Mapping[str, str] | None = None) -> SecurityConfig:
    """The process's settings: KVSTORE_SECURITY_<FIELD> variables (MODE, CA_FILE, ...)."""
    env = os.environ if env is None else env
    values = {}
    for f in fields(SecurityConfig):
        value = env.get(f"{ENV_PREFIX}{f.name.upper()}")
        if value is not None:
            values[f.name] = value
    return SecurityConfig(**values)


def to_env(config: SecurityConfig) -> dict[str, str]:
    """The variables that give a child process `config` (from_env's inverse)."""
    out = {}
    for f in fields(SecurityConfig):
        value = getattr(config, f.name)
        if value:
            out[f"{ENV_PREFIX}{f.name.upper()}"] = value
    return out


def with_mode(config: SecurityConfig, mode: str) -> SecurityConfig:
    return replace(config, mode=mode)
