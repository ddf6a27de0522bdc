"""A small asyncio HTTP/1.1 client for a vLLM engine's OpenAI-compatible server.

grpc-free and stdlib only (the conductor carries tokens here, never KV bytes): one
connection per call (`Connection: close`), a JSON body, and the answer read either
whole (`get`, `post_json`) or as server-sent events (`stream`: one dict per
`data: {...}` line, up to `data: [DONE]`), chunked transfer encoding or not. A
refused or broken connection is `UnavailableError`; an HTTP error status is
`BadRequestError` for 4xx (the engine's message included) and `UnavailableError`
for 5xx. Cancelling the caller closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from kvstore.errors import BadRequestError, UnavailableError

MAX_LINE = 1 << 20  # an SSE line carries one chunk's token ids (and the prompt's, once)


class _Response:
    def __init__(self, reader: asyncio.StreamReader, status: int, headers: dict[str, str]):
        self.reader, self.status, self.headers = reader, status, headers
        self.chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        length = headers.get("content-length")
        self.remaining = int(length) if length is not None and not self.chunked else None

    async def body_chunks(self) -> AsyncIterator[bytes]:
        if self.chunked:
            while True:
                size = int((await self.reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    return
                data = await self.reader.readexactly(size)
                await self.reader.readexactly(2)  # CRLF after each chunk
                yield data
        elif self.remaining is not None:
            if self.remaining:
                yield await self.reader.readexactly(self.remaining)
        else:
            while data := await self.reader.read(65536):
                yield data

    async def body(self) -> bytes:
        return b"".join([c async for c in self.body_chunks()])


def _target(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise BadRequestError(f"only http:// engine URLs are supported, got {url!r}")
    return (
        parts.hostname,
        parts.port or 80,
        (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
    )


@contextlib.asynccontextmanager
async def _request(method: str, url: str, body: Any, timeout_s: float) -> AsyncIterator[_Response]:
    host, port, path = _target(url)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=MAX_LINE), timeout_s
        )
    except (OSError, TimeoutError) as exc:
        raise UnavailableError(f"engine {url} unreachable: {exc}") from None
    try:
        data = b"" if body is None else json.dumps(body).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
                f"Accept: application/json, text/event-stream\r\n")  # fmt: skip
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        writer.write(head.encode() + b"\r\n" + data)
        await writer.drain()
        response = await asyncio.wait_for(_read_head(reader, url), timeout_s)
        if response.status >= 400:
            text = (await response.body()).decode(errors="replace")[:500]
            error = BadRequestError if response.status < 500 else UnavailableError
            raise error(f"engine {url} answered {response.status}: {text}")
        yield response
    except (ConnectionError, asyncio.IncompleteReadError, TimeoutError) as exc:
        raise UnavailableError(f"engine {url} failed mid-answer: {exc!r}") from None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _read_head(reader: asyncio.StreamReader, url: str) -> _Response:
    status_line = await reader.readline()
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise UnavailableError(f"engine {url}: not an HTTP answer: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return _Response(reader, int(parts[1]), headers)


async def get(url: str, timeout_s: float = 2.0) -> bytes:
    """GET `url`; the body."""
    async with _request("GET", url, None, timeout_s) as response:
        return await asyncio.wait_for(response.body(), timeout_s)


async def post_json(url: str, body: Any, timeout_s: float = 60.0) -> Any:
    """POST a JSON body; the decoded JSON answer."""
    async with _request("POST", url, body, timeout_s) as response:
        return json.loads(await asyncio.wait_for(response.body(), timeout_s))


async def stream(url: str, body: Any, timeout_s: float = 60.0) -> AsyncIterator[dict[str, Any]]:
    """POST a JSON body and yield each server-sent event's JSON, up to `[DONE]`."""
    async with _request("POST", url, body, timeout_s) as response:
        pending = b""
        async for chunk in response.body_chunks():
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                event = _event(line)
                if event is _DONE:
                    return
                if event is not None:
                    yield event
        event = _event(pending)
        if isinstance(event, dict):
            yield event


_DONE: Any = object()


def _event(line: bytes) -> Any:
    line = line.strip()
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if data == b"[DONE]":
        return _DONE
    try:
        return json.loads(data)
    except ValueError as exc:
        raise UnavailableError(f"engine sent a bad event: {data[:80]!r}: {exc}") from None
