"""Reference inference engine over a paged KV cache that the caller owns.

The engine holds weights only. KV lives in `kv_layers` (per-layer tensors in the HBM
tier's layout, see `paged_attention`) indexed through per-sequence block tables, so a
prefill node can load cached prefix blocks, `prefill` the rest chunk by chunk and
publish each layer's blocks from `on_layer_done`, and a decode node can batch any set
of sequences per `decode_step`. Attention runs per sequence, so a sequence's
attention never mixes with another's; the linear layers are batched.
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


class Engine:
    """A Llama-family decoder: `Engine(config, weights)` or `Engine(config, seed=...)`."""

    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, torch.Tensor] | None = None,
        *,
        seed: int = 0,
        device: torch.device | str | None = None,
    ) -> None:
        self.config = config
        self.device = torch.device(device) if device is not None else default_device()
        if weights is None:
            weights = random_weights(config, seed)
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        try:
            model.load_state_dict(dict(weights), strict=True, assign=True)
        except RuntimeError as e:
            raise BadRequestError(f"weights do not match the config: {e}") from e
        self.model = model.to(device=self.device, dtype=config.torch_dtype).eval()

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
        h = self.model.model.embed_tokens(ids)
        for i, layer in enumerate(self.model.model.layers):
            attend = partial(_attend_one, kv_layers[i], table, blocks, offsets, positions, end_pos)
            h = layer(h, positions, attend)
            if on_layer_done is not None:
                on_layer_done(i)
        return self.model.logits(h[-1:])[0]

    @torch.inference_mode()
    def decode_step(
        self, seqs: Sequence[SeqState], kv_layers: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        """Feed one token per sequence; return logits [len(seqs), vocab] (float32).

        Sequences may join or leave between steps: every step takes whatever is given.
        """
        if not seqs:
            raise BadRequestError("decode_step needs at least one sequence")
        ids = self._token_tensor([s.token for s in seqs])
        cache = pa.check_kv_cache(self.config, kv_layers, self.device)
        tables = []
        for s in seqs:
            self._check_span(s.position, s.position + 1)
            table = pa.check_block_table(s.block_table, s.position + 1, cache)
            tables.append(torch.tensor(table, device=self.device))
        lengths = [s.position + 1 for s in seqs]
        positions = torch.tensor([s.position for s in seqs], device=self.device)
        slots = [
            pa.slot_mapping(t, positions[j : j + 1], cache.block_tokens)
            for j, t in enumerate(tables)
        ]
        h = self.model.model.embed_tokens(ids)
        for i, layer in enumerate(self.model.model.layers):
            attend = partial(_attend_each, kv_layers[i], tables, slots, positions, lengths)
            h = layer(h, positions, attend)
        return self.model.logits(h)

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


def _attend_one(
    kv_layer: torch.Tensor,
    table: torch.Tensor,
    blocks: torch.Tensor,
    offsets: torch.Tensor,
    positions: torch.Tensor,
    length: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> torch.Tensor:
    """Write one sequence's new K/V, then attend over its first `length` tokens."""
    pa.write_kv(kv_layer, blocks, offsets, k, v)
    keys, values = pa.gather_kv(kv_layer, table, length)
    return pa.paged_attend(q, keys, values, positions)


def _attend_each(
    kv_layer: torch.Tensor,
    tables: list[torch.Tensor],
    slots: list[tuple[torch.Tensor, torch.Tensor]],
    positions: torch.Tensor,
    lengths: list[int],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> torch.Tensor:
    """Decode: one token per sequence, each attending over its own blocks only."""
    outs = []
    for j, (table, (blocks, offsets)) in enumerate(zip(tables, slots, strict=True)):
        one = slice(j, j + 1)
        args = (positions[one], lengths[j], q[one], k[one], v[one])
        outs.append(_attend_one(kv_layer, table, blocks, offsets, *args))
    return torch.cat(outs)
