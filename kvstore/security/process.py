"""A client's or node's own credential: its grpc channel credentials, and the id and
tenant it names (the master checks requests against them, so the config must agree).

    resolve(cfg, id_field="client_id", tenant_field="tenant")   # ClientConfig.__post_init__
    resolve(cfg, id_field="node_id", default_id=default_node_id())  # NodeConfig's

The credential is the config's own files (`ca_file`, `cert_file`, `key_file`,
`token_file`), else the process's KVSTORE_SECURITY_* settings; none (or explicit grpc
`credentials`) leaves the config as it is. An id or tenant left at its default becomes
the credential's; one set to something else is a BadRequestError at construction.
"""

from __future__ import annotations

from typing import Any

from kvstore.errors import BadRequestError
from kvstore.security import config as sec_config
from kvstore.security import tokens
from kvstore.security.identity import DEFAULT_TENANT, Identity, of_certificate


def security_of(cfg: Any) -> sec_config.SecurityConfig:
    files = {n: getattr(cfg, n, "") for n in ("ca_file", "cert_file", "key_file", "token_file")}
    if any(files.values()):
        return sec_config.SecurityConfig(**files)
    return sec_config.from_env()


def identity_of(sec: sec_config.SecurityConfig) -> Identity:
    if sec.mode == "tls":
        with open(sec.cert_file, "rb") as f:
            return of_certificate(f.read())
    return tokens.peek(sec.client_token())


def resolve(cfg: Any, id_field: str, tenant_field: str = "", default_id: str | None = None) -> None:
    """Fill `cfg.credentials` and check or fill its id and tenant (a frozen dataclass)."""
    if getattr(cfg, "credentials", None) is not None:
        return
    sec = security_of(cfg)
    if sec.insecure:
        return
    from kvstore.security.credentials import channel_credentials

    ident = identity_of(sec)
    object.__setattr__(cfg, "credentials", channel_credentials(sec))
    given = getattr(cfg, id_field)
    if given is None or given == default_id:
        object.__setattr__(cfg, id_field, ident.id)
    elif given != ident.id:
        raise BadRequestError(f"{id_field} {given!r} is not the credential's id {ident.id!r}")
    if tenant_field and ident.role == "client":
        want, given = ident.tenant or DEFAULT_TENANT, getattr(cfg, tenant_field)
        if not given:
            object.__setattr__(cfg, tenant_field, want)
        elif given != want:
            raise BadRequestError(f"tenant {given!r} is not the credential's tenant {want!r}")
