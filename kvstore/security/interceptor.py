"""Authentication of every gRPC call, for every kvstore server (kvstore.edge installs it).

For each call it finds the caller's `Identity` (a verified peer certificate, a token, or
the insecure anonymous one) and makes it `identity.current()` while the handler runs; a
caller without a valid credential gets UNAUTHENTICATED and nothing runs. A request that
is not valid protobuf gets INVALID_ARGUMENT (grpc itself would answer UNKNOWN). Health
checks need no credential beyond the transport's (probes).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import grpc

from kvstore.errors import UnauthenticatedError
from kvstore.security import identity, tokens
from kvstore.security.certs import fingerprint
from kvstore.security.config import SecurityConfig
from kvstore.security.identity import INSECURE, Identity

_OPEN = ("/grpc.health.v1.Health/",)
_CACHE = 4096


class Malformed:
    """What a request that failed to parse becomes (the handler never sees it)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def safe_deserializer(inner: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if inner is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return inner(data)
        except Exception as exc:  # DecodeError, or a message the parser rejects
            return Malformed(exc)

    return parse


class Revocations:
    """Fingerprints and token ids listed in a revoked_file, re-read when it changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: float | None = None
        self._checked = 0.0
        self.entries: frozenset[str] = frozenset()

    def __contains__(self, entry: str) -> bool:
        self._refresh()
        return entry in self.entries

    def _refresh(self) -> None:
        now = time.monotonic()
        if not self.path or now - self._checked < 1.0:
            return
        self._checked = now
        try:
            stamp = os.stat(self.path).st_mtime
        except OSError:
            stamp = -1.0
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            with open(self.path) as f:
                lines = (ln.split("#", 1)[0].strip().lower() for ln in f)
                self.entries = frozenset(ln for ln in lines if ln)
        except OSError:
            self.entries = frozenset()


class Authenticator:
    """The identity of one call, per the server's SecurityConfig."""

    def __init__(self, cfg: SecurityConfig) -> None:
        self.mode = cfg.mode
        self.secret = cfg.secret() if cfg.mode == "token" else b""
        self.revoked = Revocations(cfg.revoked_file)
        self._seen: OrderedDict[bytes | str, tuple[Identity, str, float]] = OrderedDict()

    def identify(self, context: Any) -> Identity:
        if self.mode == "tls":
            return self._from_cert(context.auth_context())
        if self.mode == "token":
            return self._from_token(context.invocation_metadata() or ())
        return INSECURE

    def _remember(self, key: bytes | str, value: tuple[Identity, str, float]) -> None:
        self._seen[key] = value
        if len(self._seen) > _CACHE:
            self._seen.popitem(last=False)

    def _from_cert(self, auth: dict[str, list[bytes]]) -> Identity:
        pem = (auth.get("x509_pem_cert") or [b""])[0]
        hit = self._seen.get(pem)
        if hit is None:
            ident = identity.from_auth_context(auth)
            hit = (ident, fingerprint(pem) if pem else "", float("inf"))
            self._remember(pem, hit)
        if hit[1] in self.revoked:
            raise UnauthenticatedError(f"the certificate of {hit[0]} is revoked")
        return hit[0]

    def _from_token(self, metadata: Any) -> Identity:
        token = ""
        for item in metadata:
            key, value = item[0], item[1]
            if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
                token = value[len("Bearer ") :].strip()
        if not token:
            raise UnauthenticatedError("no token: this server requires `authorization: Bearer`")
        hit = self._seen.get(token)
        if hit is None or time.time() >= hit[2]:
            ident, token_id = tokens.verify(self.secret, token)
            hit = (ident, token_id, tokens.expires_at(token))
            self._remember(token, hit)
        if hit[1] in self.revoked:
            raise UnauthenticatedError(f"the token of {hit[0]} is revoked")
        return hit[0]


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Identifies every call's caller (see the module docstring)."""

    def __init__(self, cfg: SecurityConfig) -> None:
        self.auth = Authenticator(cfg)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:  # fmt: skip
        handler = await continuation(details)
        if handler is None:
            return handler
        open_ = details.method.startswith(_OPEN)
        deser = safe_deserializer(handler.request_deserializer)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, open_), deser, handler.response_serializer
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(handler.unary_stream, open_), deser, handler.response_serializer
            )
        return handler  # no kvstore service streams requests

    async def _enter(self, request: Any, context: Any, open_: bool) -> object:
        if isinstance(request, Malformed):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {request.error}"
            )
        if open_:
            return identity.set_current(INSECURE if self.auth.mode == "insecure" else _PROBE)
        try:
            ident = self.auth.identify(context)
        except UnauthenticatedError as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        return identity.set_current(ident)

    def _unary(self, behavior: Callable[..., Any], open_: bool) -> Callable[..., Any]:
        async def call(request: Any, context: Any) -> Any:
            token = await self._enter(request, context, open_)
            try:
                return await behavior(request, context)
            finally:
                with contextlib.suppress(ValueError):
                    identity.reset_current(token)

        return call

    def _stream(self, behavior: Callable[..., Any], open_: bool) -> Callable[..., Any]:
        async def call(request: Any, context: Any) -> Any:
            token = await self._enter(request, context, open_)
            try:
                async for item in behavior(request, context):
                    yield item
            finally:
                with contextlib.suppress(ValueError):  # a generator may end in another context
                    identity.reset_current(token)

        return call


_PROBE = Identity("client", "health-probe", "", "tls")
