"""`kvstore certs`: a small local CA and tokens for a secure pool (kvstore.security).

    kvstore certs init --dir PKI                         # PKI/ca.crt, PKI/ca.key
    kvstore certs issue --dir PKI --role node --id node-1 [--host 10.0.0.5] [--days 365]
    kvstore certs issue --dir PKI --role client --id app-1 --tenant alice
    kvstore certs issue --dir PKI --role admin --id ops
    kvstore certs secret --out PKI/token.secret          # one host: a token secret
    kvstore certs token --secret PKI/token.secret --role client --id app-1 --tenant alice
    kvstore certs show PKI/app-1.crt                      # its identity and fingerprint

Then run every process with KVSTORE_SECURITY_CA_FILE / _CERT_FILE / _KEY_FILE (mTLS) or
KVSTORE_SECURITY_TOKEN_FILE, and the servers with _SECRET_FILE (docs/security.md).
"""

from __future__ import annotations

import argparse
import json
import os

from cli.common import base_parent
from cli.errors import guarded


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("certs", help="local CA, certificates and tokens (security)")
    certs = p.add_subparsers(dest="certs_command", required=True)
    parent = base_parent()
    q = certs.add_parser("init", help="create a CA", parents=[parent])
    q.add_argument("--dir", required=True, help="directory of the CA's files")
    q.add_argument("--days", type=int, default=3650)
    q.add_argument("--force", action="store_true", help="replace an existing CA")
    q.set_defaults(handler=guarded("kvstore certs init", _init))
    q = certs.add_parser("issue", help="sign a certificate for one identity", parents=[parent])
    q.add_argument("--dir", required=True, help="the CA's directory (output goes there)")
    _identity_flags(q)
    q.add_argument("--host", action="append", default=[], help="extra DNS name or IP served")
    q.add_argument("--days", type=float, default=365.0)
    q.add_argument("--name", default="", help="file name stem (default: the id)")
    q.set_defaults(handler=guarded("kvstore certs issue", _issue))
    q = certs.add_parser("secret", help="write a new token secret (0600)", parents=[parent])
    q.add_argument("--out", required=True)
    q.set_defaults(handler=guarded("kvstore certs secret", _secret))
    q = certs.add_parser("token", help="print a token for one identity", parents=[parent])
    q.add_argument("--secret", required=True, help="the secret file the servers check with")
    _identity_flags(q)
    q.add_argument("--ttl-s", type=float, default=86400.0 * 30)
    q.set_defaults(handler=guarded("kvstore certs token", _token))
    q = certs.add_parser("show", help="a certificate's identity and fingerprint", parents=[parent])
    q.add_argument("cert")
    q.set_defaults(handler=guarded("kvstore certs show", _show))


def _identity_flags(q: argparse.ArgumentParser) -> None:
    q.add_argument("--role", required=True, choices=["admin", "node", "client"])
    q.add_argument("--id", required=True, help="node id, client id or admin name")
    q.add_argument("--tenant", default="", help="a client's tenant (default: 'default')")


def _ident(args: argparse.Namespace) -> object:
    from kvstore.security.identity import Identity

    return Identity(args.role, args.id, args.tenant)


def _init(args: argparse.Namespace) -> int:
    from kvstore.security import certs

    print(certs.init_ca(args.dir, args.days, force=args.force))
    return 0


def _issue(args: argparse.Namespace) -> int:
    from kvstore.security import certs

    cert, key = certs.issue(args.dir, _ident(args), args.host, args.days, args.name)  # type: ignore[arg-type]
    print(f"{cert} {key}")
    return 0


def _secret(args: argparse.Namespace) -> int:
    from kvstore.security import tokens

    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(tokens.new_secret() + b"\n")
    print(args.out)
    return 0


def _token(args: argparse.Namespace) -> int:
    from kvstore.security import tokens
    from kvstore.security.config import SecurityConfig

    secret = SecurityConfig(mode="token", secret_file=args.secret).secret()
    print(tokens.issue(secret, _ident(args), args.ttl_s))  # type: ignore[arg-type]
    return 0


def _show(args: argparse.Namespace) -> int:
    from kvstore.security import certs
    from kvstore.security.identity import of_certificate

    with open(args.cert, "rb") as f:
        pem = f.read()
    ident = of_certificate(pem)
    doc = {"role": ident.role, "id": ident.id, "tenant": ident.tenant,
           "fingerprint": certs.fingerprint(pem)}  # fmt: skip
    print(json.dumps(doc, sort_keys=True))
    return 0
