"""grpc credentials of a SecurityConfig, for servers and for channels.

server_credentials(cfg)   tls: mTLS (a client certificate signed by ca_file required);
                          token: local credentials (loopback peers only); else None
channel_credentials(cfg)  tls: this process's certificate + the CA; token: local
                          credentials + `authorization: Bearer <token>`; else None
data_plane_server(cfg)    tls: an ssl.SSLContext for a node's TCP data plane (TLS 1.3,
                          a client certificate signed by ca_file required); else None
data_plane_client(cfg)    tls: the matching client context (the node's certificate
                          checked against ca_file and its host name); else None
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import sys
from collections.abc import Callable

import grpc

from kvstore.errors import BadRequestError
from kvstore.security.config import SecurityConfig

log = logging.getLogger("kvstore.security")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def server_credentials(cfg: SecurityConfig) -> grpc.ServerCredentials | None:
    if cfg.mode == "tls":
        pair = [(_read(cfg.key_file), _read(cfg.cert_file))]
        return grpc.ssl_server_credentials(
            pair, root_certificates=_read(cfg.ca_file), require_client_auth=True
        )
    if cfg.mode == "token":
        cfg.secret()  # fail at start, not at the first call
        return grpc.local_server_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    return None


def channel_credentials(cfg: SecurityConfig) -> grpc.ChannelCredentials | None:
    if cfg.mode == "tls":
        return grpc.ssl_channel_credentials(
            _read(cfg.ca_file), _read(cfg.key_file), _read(cfg.cert_file)
        )
    if cfg.mode == "token":
        token = cfg.client_token()
        if not token:
            raise BadRequestError("security mode token: this process has no token_file")
        return grpc.composite_channel_credentials(
            grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP),
            grpc.access_token_call_credentials(token),
        )
    return None


def channel_options(cfg: SecurityConfig) -> list[tuple[str, str]]:
    """Extra channel options (the TLS name to expect, when set)."""
    if cfg.mode == "tls" and cfg.server_name:
        return [("grpc.ssl_target_name_override", cfg.server_name)]
    return []


def warn_insecure(component: str, address: str) -> None:
    """Say loudly that a server takes every caller at its word."""
    line = (
        f"kvstore WARNING: {component or 'server'} on {address} is INSECURE: no TLS, no "
        "authentication; any process that reaches it may register nodes, read, write and "
        "remove anything. Set KVSTORE_SECURITY_MODE=tls or token (docs/security.md)."
    )
    if logging.getLogger().handlers:
        log.warning(line)
    else:
        print(line, file=sys.stderr, flush=True)


def data_plane_server(cfg: SecurityConfig) -> ssl.SSLContext | None:
    """The TLS context of a node's TCP data plane (mode tls), else None."""
    if cfg.mode != "tls":
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    ctx.load_verify_locations(cfg.ca_file)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def data_plane_client(cfg: SecurityConfig) -> ssl.SSLContext | None:
    """The TLS context a client (or node) dials nodes' data planes with (mode tls)."""
    if cfg.mode != "tls":
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname and CERT_REQUIRED
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(cfg.ca_file)
    ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ctx


def revoked_check(revoked_file: str) -> Callable[[bytes], bool]:
    """Whether a peer certificate (DER) is listed in `revoked_file` (re-read when it
    changes, as the gRPC servers read it): for the data plane's TLS."""
    from kvstore.security.interceptor import Revocations

    revocations = Revocations(revoked_file)
    return lambda der: bool(der) and hashlib.sha256(der).hexdigest() in revocations
