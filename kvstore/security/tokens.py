"""Bearer tokens for a one-host pool: (role, id, tenant, expiry, token id) under an HMAC.

    secret = new_secret()                                     # 32 random bytes, hex
    token = issue(secret, Identity("client", "app-1", "alice"), ttl_s=86400)
    ident, token_id = verify(secret, token)                   # or UnauthenticatedError

    token = "kvs1." base64url(JSON payload) "." base64url(HMAC-SHA256(secret, payload))

Tokens travel as `authorization: Bearer <token>` over gRPC local credentials (loopback
only), so they never cross a network in the clear. Expiry is the server's wall clock;
a revoked token id (SecurityConfig.revoked_file) is refused before its expiry.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time

from kvstore.errors import BadRequestError, UnauthenticatedError
from kvstore.security.identity import Identity

PREFIX = "kvs1"
MAX_TOKEN_BYTES = 4096


def new_secret() -> bytes:
    return secrets.token_hex(32).encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def issue(secret: bytes, ident: Identity, ttl_s: float = 86400.0, now: float | None = None) -> str:
    """A token for `ident`, valid `ttl_s` seconds from `now` (the wall clock)."""
    if ttl_s <= 0:
        raise BadRequestError("token ttl_s must be > 0")
    issued = time.time() if now is None else now
    payload = {
        "r": ident.role, "i": ident.id, "t": ident.tenant, "e": int(issued + ttl_s),
        "j": os.urandom(8).hex(),
    }  # fmt: skip
    body = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
    mac = hmac.new(secret, f"{PREFIX}.{body}".encode(), hashlib.sha256).digest()
    return f"{PREFIX}.{body}.{_b64(mac)}"


def verify(secret: bytes, token: str, now: float | None = None) -> tuple[Identity, str]:
    """(identity, token id) of a valid token; UnauthenticatedError for any other."""
    if len(token) > MAX_TOKEN_BYTES:
        raise UnauthenticatedError("token too long")
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise UnauthenticatedError("malformed token")
    try:
        mac = _unb64(parts[2])
    except ValueError:
        raise UnauthenticatedError("malformed token") from None
    want = hmac.new(secret, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(mac, want):
        raise UnauthenticatedError("token signature does not verify")
    try:
        payload = json.loads(_unb64(parts[1]))
        ident = Identity(payload["r"], payload["i"], payload.get("t", ""), "token")
        expires, token_id = int(payload["e"]), str(payload["j"])
    except (ValueError, KeyError, TypeError, BadRequestError):
        raise UnauthenticatedError("malformed token payload") from None
    if (time.time() if now is None else now) >= expires:
        raise UnauthenticatedError(f"token of {ident} expired")
    return ident, token_id


def expires_at(token: str) -> float:
    """The expiry (wall clock) a well-formed token carries."""
    return float(json.loads(_unb64(token.split(".")[1]))["e"])


def peek(token: str) -> Identity:
    """The identity a token claims, unverified (a client learning its own id and tenant)."""
    try:
        payload = json.loads(_unb64(token.strip().split(".")[1]))
        return Identity(payload["r"], payload["i"], payload.get("t", ""), "token")
    except (IndexError, ValueError, KeyError, TypeError):
        raise BadRequestError("not a kvstore token") from None
