"""Who a caller is: (role, id, tenant), read from its credential, never from a request.

    admin   every RPC, every tenant (operators, `kvstore` admin commands)
    node    a storage node: register, heartbeat, mount, unmount, announce and take tier
            tasks, only under its own id
    client  reads and writes its own tenant's keys; commits or revokes only its own puts;
            may lend segments to the pool, as a node named by its own id

A certificate names it in a URI subject alternative name, `kvstore://ROLE/ID?tenant=T`;
a token carries the same three fields under an HMAC (kvstore.security.tokens). Ids and
tenants are short printable names: ids of [A-Za-z0-9._:@+-], tenants of [A-Za-z0-9._-].
"""

from __future__ import annotations

import re
import subprocess
from contextvars import ContextVar
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, unquote, urlsplit

from kvstore.errors import BadRequestError, UnauthenticatedError

ROLES = ("admin", "node", "client")
_ID = re.compile(r"[A-Za-z0-9._:@+\-]{1,256}")
_TENANT = re.compile(r"[A-Za-z0-9._\-]{0,64}")
SCHEME = "kvstore"


@dataclass(frozen=True, slots=True)
class Identity:
    """A caller as its credential names it; `source` is tls, token or insecure."""

    role: str
    id: str
    tenant: str = ""
    source: str = "tls"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise BadRequestError(f"role {self.role!r}: want one of {', '.join(ROLES)}")
        if not _ID.fullmatch(self.id):
            raise BadRequestError(f"identity id {self.id!r}: 1..256 of [A-Za-z0-9._:@+-]")
        if not _TENANT.fullmatch(self.tenant):
            raise BadRequestError(f"tenant {self.tenant!r}: at most 64 of [A-Za-z0-9._-]")

    @property
    def admin(self) -> bool:
        return self.role == "admin"

    @property
    def scoped(self) -> bool:
        """True when its keys are confined to a tenant (every client in a secure mode)."""
        return self.role == "client" and self.source != "insecure"

    @property
    def namespace(self) -> str:
        """The prefix every key of a scoped identity carries ("T/")."""
        return f"{self.tenant or DEFAULT_TENANT}/"

    def uri(self) -> str:
        query = f"?tenant={quote(self.tenant)}" if self.tenant else ""
        return f"{SCHEME}://{self.role}/{quote(self.id, safe='@:+')}{query}"

    def __str__(self) -> str:
        tenant = f" tenant {self.tenant}" if self.tenant else ""
        return f"{self.role} {self.id}{tenant}"


DEFAULT_TENANT = "default"  # the tenant of a client credential that names none
# Insecure mode: one anonymous caller with every right (development only; it warns).
INSECURE = Identity("admin", "insecure", "", "insecure")
_CURRENT: ContextVar[Identity] = ContextVar("kvstore_identity", default=INSECURE)


def current() -> Identity:
    """The identity of the RPC being served (set by kvstore.security.interceptor)."""
    return _CURRENT.get()


def set_current(ident: Identity) -> object:
    return _CURRENT.set(ident)


def reset_current(token: object) -> None:
    _CURRENT.reset(token)  # type: ignore[arg-type]


def tenant_of(ident: Identity) -> str:
    """The tenant a client's keys live in (a client credential naming none: "default")."""
    return ident.tenant or DEFAULT_TENANT


def parse_uri(uri: str, source: str = "tls") -> Identity | None:
    """The Identity of a `kvstore://ROLE/ID?tenant=T` URI; None for another URI."""
    parts = urlsplit(uri)
    if parts.scheme != SCHEME or not parts.netloc:
        return None
    ident_id = parts.path.lstrip("/")
    tenant = parse_qs(parts.query).get("tenant", [""])[0]
    try:
        return Identity(parts.netloc, unquote(ident_id), tenant, source)
    except BadRequestError:
        return None


def from_auth_context(auth: dict[str, list[bytes]]) -> Identity:
    """The identity a verified peer certificate names (UnauthenticatedError if none)."""
    if auth.get("transport_security_type", [b""])[0] != b"ssl":
        raise UnauthenticatedError("no TLS peer certificate: this server requires mTLS")
    for value in auth.get("x509_subject_alternative_name", []) + auth.get("peer_uri", []):
        ident = parse_uri(value.decode(errors="replace"))
        if ident is not None:
            return ident
    raise UnauthenticatedError("the peer certificate names no kvstore identity (kvstore:// URI)")


def of_certificate(pem: bytes) -> Identity:
    """The identity a certificate (PEM) names, read locally (cryptography, else openssl)."""
    for uri in _certificate_uris(pem):
        ident = parse_uri(uri)
        if ident is not None:
            return ident
    raise BadRequestError("the certificate names no kvstore identity (kvstore:// URI)")


def _certificate_uris(pem: bytes) -> list[str]:
    try:
        from cryptography import x509
    except ImportError:
        return _openssl_uris(pem)
    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


def _openssl_uris(pem: bytes) -> list[str]:
    proc = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName"], input=pem,
        capture_output=True, check=False,
    )  # fmt: skip
    text = proc.stdout.decode(errors="replace")
    return re.findall(r"URI:([^,\s]+)", text)
