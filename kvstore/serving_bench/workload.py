"""Request schedules for serving benchmarks: a steady decode-heavy stream with bursts
of long prompts, and multi-turn conversations that share a system prompt.

Schedules are plain data, fixed by a seed: the same spec with and without bursts
yields the very same stream requests, so a no-burst run is a true baseline. Prompts
are random token ids, distinct per request, so only what a workload shares on
purpose (a conversation's history, the system prompt) can hit a prefix cache.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from kvstore.errors import BadRequestError


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request to send `at_s` seconds after the run starts."""

    at_s: float
    request_id: str
    kind: str
    prompt: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class MixSpec:
    """A decode-heavy stream (one request every `stream_every_s`, +-`jitter` of it, or
    Poisson arrivals of that mean gap when `poisson`) and, when `burst_every_s` > 0,
    bursts of `burst_size` long prompts from `first_burst_s`."""

    duration_s: float
    stream_every_s: float
    stream_prompt: int
    stream_tokens: int
    burst_every_s: float = 0.0
    burst_size: int = 2
    burst_prompt: int = 1024
    burst_tokens: int = 4
    first_burst_s: float = 1.0
    jitter: float = 0.2
    poisson: bool = False
    vocab: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.stream_every_s <= 0:
            raise BadRequestError("duration_s and stream_every_s must be positive")
        if min(self.stream_prompt, self.stream_tokens, self.burst_prompt, self.burst_tokens) < 1:
            raise BadRequestError("prompt and token counts must be >= 1")
        if self.burst_every_s < 0 or self.burst_size < 1 or not 0 <= self.jitter < 1:
            raise BadRequestError("need burst_every_s >= 0, burst_size >= 1, 0 <= jitter < 1")
        if self.vocab < 2:
            raise BadRequestError("vocab must be >= 2")

    def without_bursts(self) -> MixSpec:
        return replace(self, burst_every_s=0.0)

    def slowed(self, factor: float) -> MixSpec:
        """Every time stretched by `factor`: the same load (and the same number of
        requests) on a machine `factor` times slower than nominal."""
        if factor <= 0:
            raise BadRequestError(f"slow-down factor must be positive, got {factor}")
        return replace(
            self,
            duration_s=self.duration_s * factor,
            stream_every_s=self.stream_every_s * factor,
            burst_every_s=self.burst_every_s * factor,
            first_burst_s=self.first_burst_s * factor,
        )


def random_prompt(rng: random.Random, n: int, vocab: int) -> tuple[int, ...]:
    return tuple(rng.randrange(vocab) for _ in range(n))


def mixed_schedule(spec: MixSpec) -> list[Arrival]:
    """Stream and burst arrivals of `spec`, ordered by time."""
    stream_rng, burst_rng = random.Random(spec.seed), random.Random(spec.seed + 1)
    arrivals: list[Arrival] = []
    t, i = 0.0, 0
    while t < spec.duration_s:
        prompt = random_prompt(stream_rng, spec.stream_prompt, spec.vocab)
        arrivals.append(Arrival(t, f"s{i}", "stream", prompt, spec.stream_tokens))
        t, i = t + _gap(spec, stream_rng), i + 1
    if spec.burst_every_s > 0:
        t, b = spec.first_burst_s, 0
        while t < spec.duration_s:
            for k in range(spec.burst_size):
                prompt = random_prompt(burst_rng, spec.burst_prompt, spec.vocab)
                arrivals.append(Arrival(t, f"b{b}.{k}", "burst", prompt, spec.burst_tokens))
            t, b = t + spec.burst_every_s, b + 1
    return sorted(arrivals, key=lambda a: (a.at_s, a.request_id))


def _gap(spec: MixSpec, rng: random.Random) -> float:
    if spec.poisson:
        return rng.expovariate(1.0 / spec.stream_every_s)
    return spec.stream_every_s * (1 + spec.jitter * (2 * rng.random() - 1))


@dataclass(frozen=True, slots=True)
class ChatSpec:
    """`conversations` chats of `turns` turns; every prompt starts with one shared
    system prompt; each turn appends `user_tokens` to the history (and the reply)."""

    conversations: int = 3
    turns: int = 4
    system_tokens: int = 256
    user_tokens: int = 64
    reply_tokens: int = 16
    vocab: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        sizes = (self.conversations, self.turns, self.system_tokens, self.user_tokens)
        if min(*sizes, self.reply_tokens) < 1 or self.vocab < 2:
            raise BadRequestError("chat sizes must be >= 1 and vocab >= 2")

    @property
    def max_prompt(self) -> int:
        """Tokens of the longest prompt (the last turn)."""
        history = (self.turns - 1) * (self.user_tokens + self.reply_tokens)
        return self.system_tokens + history + self.user_tokens


@dataclass(slots=True)
class Conversation:
    """A chat's history; `next_turn` extends it with a user message, `add_reply` with
    the tokens the model answered (so the next prompt carries them, as a chat does)."""

    conv_id: int
    history: list[int]
    rng: random.Random
    spec: ChatSpec
    turn: int = 0

    def next_turn(self) -> Arrival:
        self.history.extend(random_prompt(self.rng, self.spec.user_tokens, self.spec.vocab))
        arrival = Arrival(
            0.0, f"c{self.conv_id}.t{self.turn}", "turn", tuple(self.history),
            self.spec.reply_tokens,
        )  # fmt: skip
        self.turn += 1
        return arrival

    def add_reply(self, tokens: list[int]) -> None:
        self.history.extend(tokens)


def conversations(spec: ChatSpec) -> list[Conversation]:
    rng = random.Random(spec.seed)
    system = list(random_prompt(rng, spec.system_tokens, spec.vocab))
    return [
        Conversation(c, list(system), random.Random(spec.seed * 1000 + c + 1), spec)
        for c in range(spec.conversations)
    ]
