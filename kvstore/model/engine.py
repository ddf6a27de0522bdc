"""Reference inference engine over a paged KV cache that the caller owns.

The engine holds weights only. KV lives in `kv_layers` (per-layer tensors in the HBM
tier's layout, see `paged_attention`) indexed through per-sequence block tables, so a
prefill node can load cached prefix blocks, `prefill` the rest chunk by chunk and
publish each layer's blocks from `on_layer_done`, and a decode node can batch any set
of sequences per `decode_step`. Attention runs per sequence, so a sequence's
attention never mixes with another's; the projections are batched (default) or run
one token at a time (`batch_invariant=True`, bit-exact whatever the batching).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from kvstore.errors import BadRequestError, TooLargeError
from kvstore.model import paged_attention as pa
from kvstore.model.config import ModelConfig
from kvstore.model.llama import LlamaForCausalLM, random_weights
from kvstore.model.sampling import Sampler, SamplingParams

LayerCallback = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class SeqState:
    """One sequence in a decode step: feed `token` at `position` (KV for 0..position-1
    already in the blocks of `block_table`); the step writes its KV at `position`."""

    token: int
    position: int
    block_table: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_table", tuple(int(b) for b in self.block_table))


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: torch.device | str | None) -> torch.device:
    """The concrete device ("cuda" becomes "cuda:<current>", so tensors compare equal)."""
    dev = torch.device(device) if device is not None else default_device()
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class Engine:
    """A Llama-family decoder: `Engine(config, weights)` or `Engine(config, seed=...)`.

    Default mode batches each chunk's projections: fast, but BLAS picks kernels by row
    count (MKL sgemm on CPU, cuBLAS on GPU), so a token's bits depend on its chunk or
    decode batch (~1e-6 apart in float32; greedy tokens agree in practice).
    `batch_invariant=True` computes every token as its own 1-row step, layer by layer:
    slower, but KV bytes and logits are then bit-identical whatever the chunking and
    batch composition (prefill and decode nodes must agree on the mode).
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, torch.Tensor] | None = None,
        *,
        seed: int = 0,
        device: torch.device | str | None = None,
        batch_invariant: bool = False,
    ) -> None:
        self.config = config
        self.batch_invariant = batch_invariant
        self.device = resolve_device(device)
        if weights is None:
            weights = random_weights(config, seed)
        # Fresh copies: BLAS results can depend on the memory alignment of the weights,
        # and tensors read from a safetensors file sit at arbitrary offsets.
        owned = {n: t.to(self.device, config.torch_dtype, copy=True) for n, t in weights.items()}
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        try:
            model.load_state_dict(owned, strict=True, assign=True)
        except RuntimeError as e:
            raise BadRequestError(f"weights do not match the config: {e}") from e
        self.model = model.eval()

    @classmethod
    def from_checkpoint(cls, path: str, device: torch.device | str | None = None) -> Engine:
        """Load a local Hugging Face-format directory (see `checkpoint.load_hf_checkpoint`)."""
        from kvstore.model.checkpoint import load_hf_checkpoint

        config, weights = load_hf_checkpoint(path)
        return cls(config, weights, device=device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Weights by Hugging Face tensor name (on the engine's device)."""
        return dict(self.model.state_dict())

    def _token_tensor(self, tokens: Sequence[int]) -> torch.Tensor:
        ids = [int(t) for t in tokens]
        if not ids:
            raise BadRequestError("empty token list")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise BadRequestError(f"token {bad[0]} outside vocab of {self.config.vocab_size}")
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    def _check_span(self, start_pos: int, end_pos: int) -> None:
        if start_pos < 0:
            raise BadRequestError(f"negative position {start_pos}")
        if end_pos > self.config.max_position:
            raise TooLargeError(
                f"positions up to {end_pos} exceed max_position {self.config.max_position}"
            )

    @torch.inference_mode()
    def prefill(
        self,
        tokens: Sequence[int],
        block_table: Sequence[int],
        start_pos: int,
        kv_layers: Sequence[torch.Tensor],
        on_layer_done: LayerCallback | None = None,
    ) -> torch.Tensor:
        """Compute positions start_pos..start_pos+len-1 of one sequence; return the last
        token's logits [vocab] (float32).

        KV for positions 0..start_pos-1 must already be in the table's blocks (computed
        earlier or loaded from the store): that is how a prefix hit skips compute, and
        calling this repeatedly is chunked prefill. `on_layer_done(i)` runs once per
        layer, in order, after layer i's K/V for this chunk is in kv_layers[i]; on CUDA
        the writes are queued on the current stream, so sync before another stream
        reads them.
        """
        ids = self._token_tensor(tokens)
        end_pos = start_pos + ids.shape[0]
        self._check_span(start_pos, end_pos)
        cache = pa.check_kv_cache(self.config, kv_layers, self.device)
        table = torch.tensor(pa.check_block_table(block_table, end_pos, cache), device=self.device)
        positions = torch.arange(start_pos, end_pos, device=self.device)
        blocks, offsets = pa.slot_mapping(table, positions, cache.block_tokens)
        whole = _Span(slice(0, len(ids)), table, blocks, offsets, positions, end_pos)
        spans = _split_tokens(whole) if self.batch_invariant else [whole]
        h = self._layers(
            self.model.model.embed_tokens(ids), positions, spans, kv_layers, on_layer_done
        )
        return self.model.logits(h[-1:])[0]

    @torch.inference_mode()
    def decode_step(
        self, seqs: Sequence[SeqState], kv_layers: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        """Feed one token per sequence; return logits [len(seqs), vocab] (float32).

        Sequences may join or leave between steps: every step takes whatever is given.
        Attention runs per sequence; the projections are batched unless batch_invariant.
        """
        if not seqs:
            raise BadRequestError("decode_step needs at least one sequence")
        ids = self._token_tensor([s.token for s in seqs])
        cache = pa.check_kv_cache(self.config, kv_layers, self.device)
        positions = torch.tensor([s.position for s in seqs], device=self.device)
        spans = []
        for j, s in enumerate(seqs):
            self._check_span(s.position, s.position + 1)
            table = pa.check_block_table(s.block_table, s.position + 1, cache)
            table_t = torch.tensor(table, device=self.device)
            pos = positions[j : j + 1]
            blocks, offsets = pa.slot_mapping(table_t, pos, cache.block_tokens)
            spans.append(_Span(slice(j, j + 1), table_t, blocks, offsets, pos, s.position + 1))
        h = self._layers(self.model.model.embed_tokens(ids), positions, spans, kv_layers, None)
        return self.model.logits(h) if not self.batch_invariant else self._row_logits(h)

    def _layers(
        self,
        h: torch.Tensor,
        positions: torch.Tensor,
        spans: list[_Span],
        kv_layers: Sequence[torch.Tensor],
        on_layer_done: LayerCallback | None,
    ) -> torch.Tensor:
        """Run every decoder layer; batch_invariant runs each span (one token) alone."""
        for i, layer in enumerate(self.model.model.layers):
            if self.batch_invariant:
                outs = [
                    layer(h[s.rows], s.positions, partial(_attend, kv_layers[i], s)) for s in spans
                ]
                h = torch.cat(outs)
            else:
                h = layer(h, positions, partial(_attend_spans, kv_layers[i], spans))
            if on_layer_done is not None:
                on_layer_done(i)
        return h

    def _row_logits(self, h: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.model.logits(h[j : j + 1]) for j in range(h.shape[0])])

    @torch.inference_mode()
    def forward_dense(self, tokens: Sequence[int]) -> torch.Tensor:
        """No-cache reference: logits [n, vocab] of every prompt position."""
        ids = self._token_tensor(tokens)
        self._check_span(0, ids.shape[0])
        return self.model.forward_dense(ids)

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams | None = None,
        *,
        stop_ids: Collection[int] = (),
        block_tokens: int = 16,
    ) -> list[int]:
        """Colocated prefill + decode of one prompt in a private cache; new tokens out."""
        if max_new_tokens <= 0:
            raise BadRequestError(f"max_new_tokens must be positive, got {max_new_tokens}")
        total = len(prompt) + max_new_tokens
        self._check_span(0, total)
        num_blocks = -(-total // block_tokens)
        kv = pa.allocate_kv_cache(self.config, num_blocks, block_tokens, self.device)
        table = tuple(range(num_blocks))
        sampler = Sampler(sampling or SamplingParams())
        out = [sampler.sample(self.prefill(prompt, table, 0, kv))]
        while len(out) < max_new_tokens and out[-1] not in stop_ids:
            step = SeqState(token=out[-1], position=len(prompt) + len(out) - 1, block_table=table)
            out.append(sampler.sample(self.decode_step([step], kv)[0]))
        return out


@dataclass(frozen=True, slots=True)
class _Span:
    """Rows of a step that attend together: tokens of one sequence, in order."""

    rows: slice
    table: torch.Tensor  # the sequence's block ids
    blocks: torch.Tensor  # block id of each row's KV slot
    offsets: torch.Tensor  # offset within that block
    positions: torch.Tensor
    length: int  # keys visible to the last row: its position + 1


def _split_tokens(span: _Span) -> list[_Span]:
    """One span per token, so each token is computed alone (batch_invariant)."""
    n = span.rows.stop - span.rows.start
    first_row, first_pos = span.rows.start, span.length - n
    return [
        _Span(
            rows=slice(first_row + i, first_row + i + 1),
            table=span.table,
            blocks=span.blocks[i : i + 1],
            offsets=span.offsets[i : i + 1],
            positions=span.positions[i : i + 1],
            length=first_pos + i + 1,
        )
        for i in range(n)
    ]


def _attend(
    kv_layer: torch.Tensor, span: _Span, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """Write one span's new K/V, then attend over its sequence's first `length` tokens."""
    pa.write_kv(kv_layer, span.blocks, span.offsets, k, v)
    keys, values = pa.gather_kv(kv_layer, span.table, span.length)
    return pa.paged_attend(q, keys, values, span.positions)


def _attend_spans(
    kv_layer: torch.Tensor, spans: list[_Span], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """Attention for a batch of rows: each span (sequence) over its own blocks only."""
    if len(spans) == 1:
        return _attend(kv_layer, spans[0], q, k, v)
    return torch.cat([_attend(kv_layer, s, q[s.rows], k[s.rows], v[s.rows]) for s in spans])
