"""A small local certificate authority for tests and first deployments.

    init_ca("/etc/kvstore/pki")                                   # ca.crt, ca.key (0600)
    issue("/etc/kvstore/pki", Identity("node", "node-1"), hosts=["10.0.0.5"])
        # -> node-1.crt, node-1.key: CN node-1, SAN kvstore://node/node-1 + the hosts
    fingerprint(open("node-1.crt", "rb").read())                  # for a revoked_file

Every certificate is also a server certificate for localhost, 127.0.0.1, ::1, this host's
name and `hosts` (a master, node or conductor serves on them). Keys are ECDSA P-256.
Built with the `cryptography` package when it is installed, else the openssl command.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kvstore.errors import BadRequestError, NotFoundError
from kvstore.security.identity import Identity

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


def have_cryptography() -> bool:
    try:
        import cryptography.x509  # noqa: F401
    except ImportError:
        return False
    return True


def init_ca(directory: str | os.PathLike[str], days: int = 3650, name: str = "kvstore-ca",
            force: bool = False) -> Path:  # fmt: skip
    """Create the CA's certificate and key in `directory`; the certificate's path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    if (d / CA_KEY).exists() and not force:
        raise BadRequestError(f"{d / CA_KEY} exists (force to replace it)")
    if have_cryptography():
        cert, key = _crypto_ca(name, days)
    else:
        cert, key = _openssl_ca(name, days)
    _write(d / CA_KEY, key, private=True)
    _write(d / CA_CERT, cert)
    return d / CA_CERT


def issue(
    directory: str | os.PathLike[str], ident: Identity, hosts: Sequence[str] = (),
    days: float = 365, name: str = "", valid_from_days: float = 0.0,
) -> tuple[Path, Path]:  # fmt: skip
    """Sign a certificate for `ident` with the CA in `directory`: (cert path, key path).
    `valid_from_days` < 0 back-dates it (with a small `days`: an expired certificate)."""
    d = Path(directory)
    if not (d / CA_KEY).exists():
        raise NotFoundError(f"no CA in {d}: run `kvstore certs init --dir {d}` first")
    names = list(dict.fromkeys([*DEFAULT_HOSTS, socket.gethostname(), *hosts]))
    ca_cert, ca_key = (d / CA_CERT).read_bytes(), (d / CA_KEY).read_bytes()
    if have_cryptography():
        cert, key = _crypto_issue(ca_cert, ca_key, ident, names, days, valid_from_days)
    else:
        cert, key = _openssl_issue(d, ident, names, days, valid_from_days)
    base = name or ident.id.replace(":", "_")
    _write(d / f"{base}.key", key, private=True)
    _write(d / f"{base}.crt", cert)
    return d / f"{base}.crt", d / f"{base}.key"


def fingerprint(pem: bytes) -> str:
    """sha256 of the certificate's DER, hex: what a revoked_file lists."""
    lines = [ln for ln in pem.decode().splitlines() if ln and not ln.startswith("-----")]
    return hashlib.sha256(base64.b64decode("".join(lines))).hexdigest()


def _write(path: Path, data: bytes, private: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _san_entries(names: Sequence[str]) -> list[tuple[str, str]]:
    out = []
    for n in names:
        try:
            out.append(("IP", str(ipaddress.ip_address(n))))
        except ValueError:
            out.append(("DNS", n))
    return out


# ---- cryptography -------------------------------------------------------------


def _crypto_ca(name: str, days: int) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return _pem(cert), _key_pem(key)


def _crypto_issue(
    ca_pem: bytes, ca_key_pem: bytes, ident: Identity, names: Sequence[str], days: float,
    valid_from_days: float,
) -> tuple[bytes, bytes]:  # fmt: skip
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, None)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(ident.uri())]
    for kind, value in _san_entries(names):
        sans.append(
            x509.IPAddress(ipaddress.ip_address(value)) if kind == "IP" else x509.DNSName(value)
        )
    start = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=valid_from_days)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ident.id)]))
        .issuer_name(ca.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - datetime.timedelta(minutes=5))
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )  # fmt: skip
    return _pem(cert), _key_pem(key)


def _pem(cert: object) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)  # type: ignore[attr-defined,no-any-return]


def _key_pem(key: object) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(  # type: ignore[attr-defined,no-any-return]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )  # fmt: skip


# ---- openssl command (no cryptography package) -----------------------------------


def _openssl(*args: str, stdin: bytes | None = None) -> bytes:
    try:
        proc = subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=False)
    except FileNotFoundError:
        raise BadRequestError("neither the cryptography package nor openssl is here") from None
    if proc.returncode != 0:
        raise BadRequestError(f"openssl {args[0]} failed: {proc.stderr.decode()[-300:]}")
    return proc.stdout


def _openssl_ca(name: str, days: int) -> tuple[bytes, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        key, cert = f"{tmp}/k", f"{tmp}/c"
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", cert, "-subj", f"/CN={name}", "-days", str(days),
            "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        return Path(cert).read_bytes(), Path(key).read_bytes()


def _openssl_issue(
    d: Path, ident: Identity, names: Sequence[str], days: float, valid_from_days: float
) -> tuple[bytes, bytes]:
    if valid_from_days:
        raise BadRequestError("back-dated certificates need the cryptography package")
    san = ",".join([f"URI:{ident.uri()}", *(f"{k}:{v}" for k, v in _san_entries(names))])
    with tempfile.TemporaryDirectory() as tmp:
        key, csr, cert, ext = f"{tmp}/k", f"{tmp}/r", f"{tmp}/c", f"{tmp}/e"
        Path(ext).write_text(
            f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
        )
        _openssl(
            "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", csr, "-subj", f"/CN={ident.id}",
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", csr, "-CA", str(d / CA_CERT), "-CAkey", str(d / CA_KEY),
            "-CAcreateserial", "-out", cert, "-days", str(max(1, int(days))), "-extfile", ext,
        )  # fmt: skip
        return Path(cert).read_bytes(), Path(key).read_bytes()
