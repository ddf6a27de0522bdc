"""Byte-level tokenizer: ids 0..255 are bytes, then a few special tokens.

No vocabulary file, no download: any UTF-8 text round-trips exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.errors import BadRequestError

BYTE_VOCAB = 256
BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
VOCAB_SIZE = 260  # one id reserved, so the tiny model's vocab is 260


class ByteTokenizer:
    """Encode text to byte ids (optionally with BOS/EOS) and decode back."""

    bos_id = BOS_ID
    eos_id = EOS_ID
    pad_id = PAD_ID
    vocab_size = VOCAB_SIZE

    def encode(self, text: str, *, add_bos: bool = True, add_eos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return ([BOS_ID] if add_bos else []) + ids + ([EOS_ID] if add_eos else [])

    def decode(self, ids: Sequence[int]) -> str:
        """Decode ids to text, dropping special tokens; bad UTF-8 becomes U+FFFD."""
        for i in ids:
            if not 0 <= i < VOCAB_SIZE:
                raise BadRequestError(f"token id {i} outside vocab of {VOCAB_SIZE}")
        return bytes(i for i in ids if i < BYTE_VOCAB).decode("utf-8", errors="replace")
