"""Block identity: chained prefix hashes, pinned vectors, cross-process determinism."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest
import xxhash

from kvstore.errors import BadRequestError
from kvstore.hashing import (
    block_hashes,
    extend_hashes,
    longest_cached_prefix,
    make_namespace,
    root_hash,
)

# The same vectors are listed in docs/hashing.md.
VECTORS = {
    "root": "1668bb1a614d558575fe5725e9744a89",
    "range8_bs4": ["dd54cf7d2306c4a6da025292fc2f91cb", "8865ba6aa4de8ccb997388a63eb08ea4"],
    "ns_1to9_bs4": ["b078f1295a627aede959b6e276bac8de", "4753ae3314a4e9a06f0fd2bd700d6042"],
}
NS = make_namespace("llama-3-8b", tenant="acme", kv_dtype="float16", kv_layout="nhd")


def test_pinned_vectors() -> None:
    assert root_hash(b"").hex() == VECTORS["root"]
    assert [h.hex() for h in block_hashes(list(range(8)), 4)] == VECTORS["range8_bs4"]
    assert [h.hex() for h in block_hashes(list(range(1, 10)), 4, NS)] == VECTORS["ns_1to9_bs4"]


def test_definition_matches_spec() -> None:
    """h_i = xxh3_128(h_{i-1} || u32-LE tokens), recomputed here by hand."""
    prev = xxhash.xxh3_128_digest(b"kvstore/v1\0")
    expected = []
    for block in ([0, 1, 2, 3], [4, 5, 6, 7]):
        prev = xxhash.xxh3_128_digest(prev + struct.pack("<4I", *block))
        expected.append(prev)
    assert block_hashes(list(range(8)), 4) == expected


def test_partial_last_block_gets_no_hash() -> None:
    assert len(block_hashes(list(range(11)), 4)) == 2
    assert block_hashes(list(range(3)), 4) == []
    assert block_hashes([], 4) == []


def test_change_in_block_k_changes_k_onwards_only() -> None:
    tokens = list(range(100, 132))
    base = block_hashes(tokens, 4)
    changed = tokens.copy()
    changed[13] += 1  # block 3
    after = block_hashes(changed, 4)
    assert after[:3] == base[:3]
    assert all(a != b for a, b in zip(after[3:], base[3:], strict=True))


def test_namespace_fields_all_matter() -> None:
    tokens = list(range(8))
    variants = [
        make_namespace("m"),
        make_namespace("m2"),
        make_namespace("m", tenant="t"),
        make_namespace("m", kv_dtype="bfloat16"),
        make_namespace("m", kv_layout="hnd"),
        make_namespace("m", tp_rank=1, tp_size=2),
        make_namespace("m", tp_rank=0, tp_size=2),
    ]
    firsts = {block_hashes(tokens, 4, ns)[0] for ns in variants}
    assert len(firsts) == len(variants)
    # length-prefixed fields: moving a character between fields changes the namespace
    assert make_namespace("ab", tenant="c") != make_namespace("a", tenant="bc")


def test_extend_continues_a_chain() -> None:
    tokens = list(range(24))
    full = block_hashes(tokens, 4)
    assert extend_hashes(full[2], tokens[12:], 4) == full[3:]


@pytest.mark.parametrize(
    "tokens, block_size",
    [([1, 2], 0), ([1, 2], -4), ([-1, 2], 1), ([2**32], 1), ([[1, 2]], 1), ([1.5, 2.0], 1)],
)
def test_bad_input_is_rejected(tokens: list, block_size: int) -> None:
    with pytest.raises(BadRequestError):
        block_hashes(tokens, block_size)


def test_bad_namespace_fields() -> None:
    with pytest.raises(BadRequestError):
        make_namespace("")
    with pytest.raises(BadRequestError):
        make_namespace("m", tp_rank=2, tp_size=2)


def test_longest_cached_prefix_asks_once() -> None:
    hashes = block_hashes(list(range(40)), 4)
    cached = set(hashes[:3]) | {hashes[5]}  # a hole at 3: prefix stops there
    calls: list[int] = []

    def batch_exists(query: list[bytes]) -> list[bool]:
        calls.append(len(query))
        return [h in cached for h in query]

    assert longest_cached_prefix(hashes, batch_exists) == 3
    assert calls == [10]
    assert longest_cached_prefix([], batch_exists) == 0
    assert longest_cached_prefix(hashes[:3], batch_exists) == 3
    with pytest.raises(BadRequestError):
        longest_cached_prefix(hashes, lambda q: [True])


_CHILD = """
import sys
from kvstore.hashing import block_hashes, make_namespace
ns = make_namespace("model-x", tenant="t1")
print(",".join(h.hex() for h in block_hashes(list(range(1000, 1100)), 16, ns)))
"""


def test_deterministic_across_processes_and_hash_seeds() -> None:
    outputs = set()
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run(
            [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(run.stdout.strip())
    assert len(outputs) == 1
    here = ",".join(
        h.hex()
        for h in block_hashes(list(range(1000, 1100)), 16, make_namespace("model-x", tenant="t1"))
    )
    assert outputs == {here}
