"""`kvstore config show [SECTION...] [--config FILE] [--json]`: the effective configuration
and where each value came from (default, FILE:LINE, env VAR)."""

from __future__ import annotations

import argparse
from typing import Any

from cli.common import base_parent, emit
from cli.errors import guarded


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="configuration: `config show`", parents=[base_parent()])
    verbs = p.add_subparsers(dest="verb", required=True)
    show = verbs.add_parser(
        "show", help="effective config with provenance", parents=[base_parent()]
    )
    show.add_argument("sections", nargs="*", help="default: all sections")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=guarded("kvstore config show", run_show))


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def run_show(args: argparse.Namespace) -> int:
    from kvstore.config import SECRET_FIELDS, SECTIONS, load

    layers = load(args.config)
    names = args.sections or list(SECTIONS)
    doc: dict[str, Any] = {"file": layers.path or None}
    lines = [f"# config file: {layers.path or '(none)'}"]
    for name in names:
        rows = [(k, "<redacted>" if (name, k) in SECRET_FIELDS and v else v, s)
                for k, v, s in layers.section(name).rows()]  # fmt: skip
        doc[name] = {k: {"value": _plain(v), "source": s} for k, v, s in rows}
        lines.append(f"[{name}]")
        width = max((len(k) for k, _, _ in rows), default=0)
        for key, value, source in rows:
            lines.append(f"{key:<{width}} = {value!r:<24} # {source}")
    emit(args, doc, "\n".join(lines))
    return 0
