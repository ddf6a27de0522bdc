"""Exit codes of the `kvstore` command, and the guard that turns any failure of a
subcommand into one readable line on stderr (a traceback only with `--debug`).

    code  meaning                                   raised as
    0     success
    1     failure not listed below (internal error)  any other exception
    2     bad usage: unknown flag, bad value         argparse, BadRequestError, TooLargeError
    3     not found: key, node, segment              NotFoundError
    4     unavailable: a service is down or late     UnavailableError, TransferError
    5     refused: leased, pinned, being written,    NotReadyError, ExistsError, RefusedError
          or an operation that would lose data
    6     no space in the pool                       NoSpaceError
    7     data corrupt or an I/O fault               CorruptError, IOFaultError
    130   interrupted (Ctrl-C)                       KeyboardInterrupt
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable

from kvstore import errors

OK, FAILED, USAGE, NOT_FOUND, UNAVAILABLE, REFUSED, NO_SPACE, CORRUPT = range(8)
INTERRUPTED = 130


class RefusedError(errors.KVStoreError):
    """The command would do harm (e.g. drain the last replica) and was not forced."""


_CODES: list[tuple[type[BaseException], int]] = [
    (errors.BadRequestError, USAGE),  # TooLargeError included
    (errors.NotFoundError, NOT_FOUND),
    (errors.UnavailableError, UNAVAILABLE),
    (errors.TransferError, UNAVAILABLE),
    (errors.NotReadyError, REFUSED),
    (errors.ExistsError, REFUSED),
    (RefusedError, REFUSED),
    (errors.NoSpaceError, NO_SPACE),
    (errors.CorruptError, CORRUPT),
    (errors.IOFaultError, CORRUPT),
]


def exit_code(exc: BaseException) -> int:
    """The documented exit code of an exception."""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED
    return FAILED


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, errors.KVStoreError):
        return text
    return f"{type(exc).__name__}: {text}"


def guarded(prog: str, handler: Callable[[argparse.Namespace], int | None]) -> Callable[..., int]:
    """Wrap a subcommand handler: its exceptions become one line and an exit code."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(handler(args) or 0)
        except SystemExit:
            raise
        except BaseException as exc:
            if getattr(args, "debug", False):
                traceback.print_exc()
            code = exit_code(exc)
            if code == INTERRUPTED:
                print(f"{prog}: interrupted", file=sys.stderr)
            else:
                hint = "" if code != FAILED else " (run with --debug for the traceback)"
                print(f"{prog}: {one_line(exc)}{hint}", file=sys.stderr)
            return code

    run.guarded = True  # type: ignore[attr-defined]
    return run
