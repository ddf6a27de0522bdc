"""Exit codes of the `kvstore` command, and the guard that turns any failure of a
subcommand into one readable line on stderr (a traceback only with `--debug`).

    code  meaning                                   raised as
    0     success
    1     failure not listed below (internal error)  any other exception
    2     bad usage: unknown flag, bad value         argparse, BadRequestError, TooLargeError
    3     not found: key, node, segment              NotFoundError
    4     unavailable: a service is down or late     UnavailableError, TransferError
    5     refused: leased, pinned, being written,    NotReadyError, ExistsError, RefusedError,
          an operation that would lose data, not     PermissionDeniedError, UnauthenticatedError
          allowed to this credential, no credential
    6     no space in the pool                       NoSpaceError
    7     data corrupt or an I/O fault               CorruptError, IOFaultError
    130   interrupted (Ctrl-C)                       KeyboardInterrupt
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

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
    (errors.PermissionDeniedError, REFUSED),  # the credential may not do this
    (errors.UnauthenticatedError, REFUSED),  # no (valid) credential
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


class OneLineParser(argparse.ArgumentParser):
    """A bad flag is one line and exit code 2 (argparse prints the usage block)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(USAGE)


def debugging() -> bool:
    """KVSTORE_DEBUG=1: tracebacks and grpc's own logs are wanted."""
    import os

    return os.environ.get("KVSTORE_DEBUG", "") not in ("", "0")


def quiet_grpc() -> None:
    """Before grpc is imported: grpc's C core logs a failed bind itself; the line a service
    prints about it is ours (KVSTORE_DEBUG=1 keeps grpc's)."""
    import os

    if not debugging():
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")


def check_listen(listen: str) -> None:
    """UnavailableError when HOST:PORT cannot be bound now (in use, or no such address):
    checked with a plain socket before grpc tries, so the failure is one line."""
    import socket

    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise errors.BadRequestError(f"bad listen address {listen!r}, want HOST:PORT")
    if int(port) == 0:
        return
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, int(port)))
        except OSError as exc:
            raise errors.UnavailableError(f"cannot listen on {listen!r}: {exc.strerror}") from None


def wait_reachable(addresses: str, timeout_s: float) -> None:
    """Until one of `addresses` (HOST:PORT[,HOST:PORT...]) accepts a TCP connection;
    UnavailableError naming them after `timeout_s`."""
    import socket
    import time

    targets = [a.strip() for a in addresses.split(",") if a.strip()]
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        for target in targets:
            host, _, port = target.rpartition(":")
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                    return
            except (OSError, ValueError) as exc:
                last = getattr(exc, "strerror", None) or str(exc)
        if time.monotonic() >= deadline:
            raise errors.UnavailableError(
                f"master {addresses} unreachable after {timeout_s:g} s ({last})"
            )
        time.sleep(0.2)


def entry_point(prog: str, run: Callable[[], int | None]) -> int:
    """A `python -m ...` service's main: any failure of `run` becomes one line on stderr
    (`prog: <message>`) and the exit code above; a traceback only with KVSTORE_DEBUG=1."""
    try:
        return int(run() or 0)
    except SystemExit:
        raise
    except BaseException as exc:
        if debugging():
            traceback.print_exc()
        code = exit_code(exc)
        if code == INTERRUPTED:
            return code
        hint = "" if code != FAILED else " (KVSTORE_DEBUG=1 for the traceback)"
        text = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{prog}: {type(exc).__name__}: {text}{hint}", file=sys.stderr, flush=True)
        return code
