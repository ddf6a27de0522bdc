"""What every `kvstore` subcommand shares: `--config`, `--debug`, and for the admin
commands `--master`, `--timeout-s`, `--json`, resolved through kvstore.config (flag, then
KVSTORE_CLI_MASTER / KVSTORE_CLI_TIMEOUT_S, then the file's [cli] section, then default)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvstore.types import Tier


def base_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--config", default=None, help="TOML config file (default: $KVSTORE_CONFIG)")
    p.add_argument("--debug", action="store_true", help="print tracebacks")
    return p


def admin_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, parents=[base_parent()])
    p.add_argument("--master", default=None, help="HOST:PORT (default 127.0.0.1:50051)")
    p.add_argument("--timeout-s", type=float, default=None, help="deadline of each call (5)")
    p.add_argument("--json", action="store_true", help="one JSON document, for scripts")
    return p


def cli_settings(args: argparse.Namespace) -> Any:
    """The effective CliConfig of these flags (kvstore.config precedence)."""
    from kvstore.config import apply_security, load

    flags = {
        "master": getattr(args, "master", None),
        "timeout_s": getattr(args, "timeout_s", None),
        "conductor": getattr(args, "conductor", None),
    }
    layers = load(args.config)
    apply_security(layers)  # [security]: the credential the command's calls present
    return layers.section("cli", flags).build()


def master_api(args: argparse.Namespace) -> Any:
    from cli.master_api import MasterApi

    cfg = cli_settings(args)
    return MasterApi(cfg.master, cfg.timeout_s)


def emit(args: argparse.Namespace, doc: Any, text: str) -> None:
    """Print `doc` as JSON with --json, else `text`."""
    if getattr(args, "json", False):
        print(json.dumps(doc, sort_keys=True))
    else:
        print(text)
    sys.stdout.flush()


def tier_name(value: int) -> str:
    return Tier(value).name if value in Tier._value2member_map_ else str(value)


def parse_tier(text: str) -> Tier:
    from kvstore.errors import BadRequestError

    try:
        return Tier[text.upper()]
    except KeyError:
        valid = ", ".join(t.name.lower() for t in Tier)
        raise BadRequestError(f"unknown tier {text!r}; valid: {valid}") from None


def table(head: tuple[str, ...], rows: list[tuple[str, ...]], right_from: int = 1) -> str:
    """Fixed-width columns; columns from `right_from` on are right-aligned."""
    cells = [head, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]

    def fmt(r: tuple[str, ...]) -> str:
        parts = [
            c.ljust(w) if i < right_from else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([fmt(head), *(fmt(r) for r in rows)])
