"""The local CA helper and tokens (kvstore.security.certs / tokens) and `kvstore certs`:
what they issue names the identity the servers read, with the cryptography package and
with the openssl command alone."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvstore.errors import BadRequestError, UnauthenticatedError
from kvstore.security import certs, identity, tokens
from kvstore.security.identity import Identity, of_certificate
from tests.cluster import REPO, child_env


def kvstore(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True,
                          text=True, env=child_env(), cwd=REPO, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_kvstore_certs_commands(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    assert kvstore("certs", "init", "--dir", str(pki)).endswith("ca.crt")
    kvstore("certs", "issue", "--dir", str(pki), "--role", "client", "--id", "app-1",
            "--tenant", "alice", "--host", "10.0.0.5")  # fmt: skip
    shown = json.loads(kvstore("certs", "show", str(pki / "app-1.crt")))
    assert {k: shown[k] for k in ("role", "id", "tenant")} == {
        "role": "client",
        "id": "app-1",
        "tenant": "alice",
    }
    assert shown["fingerprint"] == certs.fingerprint((pki / "app-1.crt").read_bytes())
    assert (pki / "app-1.key").stat().st_mode & 0o777 == 0o600
    kvstore("certs", "secret", "--out", str(pki / "s"))
    token = kvstore("certs", "token", "--secret", str(pki / "s"), "--role", "node", "--id", "n1")
    ident, _ = tokens.verify((pki / "s").read_bytes().strip(), token)
    assert ident == Identity("node", "n1", "", "token")


def test_openssl_fallback_issues_the_same_identity(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(certs, "have_cryptography", lambda: False)
    certs.init_ca(tmp_path)
    cert, _ = certs.issue(tmp_path, Identity("node", "n7"), hosts=["10.1.2.3"])
    assert identity._openssl_uris(cert.read_bytes()) == ["kvstore://node/n7"]
    assert of_certificate(cert.read_bytes()) == Identity("node", "n7")
    verify = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(cert)],
                            capture_output=True, text=True)  # fmt: skip
    assert verify.returncode == 0, verify.stderr
    with pytest.raises(BadRequestError):
        certs.init_ca(tmp_path)  # an existing CA is not replaced unless forced


def test_tokens_bind_the_identity() -> None:
    secret = tokens.new_secret()
    ident = Identity("client", "app-1", "alice")
    token = tokens.issue(secret, ident, ttl_s=60)
    assert tokens.verify(secret, token)[0] == Identity("client", "app-1", "alice", "token")
    body = token.split(".")
    forged = tokens.issue(secret, Identity("admin", "app-1"), ttl_s=60).split(".")
    for bad in (
        f"{body[0]}.{forged[1]}.{body[2]}",  # another payload under alice's signature
        tokens.issue(b"another secret, 32 bytes long....", ident),
        tokens.issue(secret, ident, ttl_s=1, now=time.time() - 5),  # expired
        "kvs1..",
        "x" * 5000,
    ):
        with pytest.raises(UnauthenticatedError):
            tokens.verify(secret, bad)


def test_identity_uris_round_trip() -> None:
    for ident in (Identity("admin", "ops"), Identity("client", "a@b:c+d", "t-1.x")):
        assert identity.parse_uri(ident.uri()) == ident
    assert identity.parse_uri("spiffe://x/y") is None
    assert identity.parse_uri("kvstore://root/x") is None  # not a role
    with pytest.raises(BadRequestError):
        Identity("client", "a/b")  # ids are names, not paths
