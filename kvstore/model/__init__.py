"""kvstore.model: reference Llama-family engine over a paged KV cache in the HBM layout."""

from kvstore.model.config import ModelConfig
from kvstore.model.engine import Engine, SeqState
from kvstore.model.paged_attention import allocate_kv_cache
from kvstore.model.sampling import Sampler, SamplingParams
from kvstore.model.tokenizer import ByteTokenizer

__all__ = [
    "ByteTokenizer",
    "Engine",
    "ModelConfig",
    "Sampler",
    "SamplingParams",
    "SeqState",
    "allocate_kv_cache",
]
