"""The conductor's in-flight ledger and the index over a MatchPrefix answer (no processes)."""

from __future__ import annotations

import pytest

from kvstore.conductor.api import PrefixMatch, Role
from kvstore.conductor.identity import IdentityBook, IdentityOverrides, KeyIdentity
from kvstore.conductor.index import MatchAnswerIndex, Run
from kvstore.conductor.ledger import Ledger, NodeInfo
from kvstore.conductor.service_config import ConductorConfig
from kvstore.errors import BadRequestError, ExistsError, NotFoundError
from kvstore.hashing import block_hashes
from kvstore.types import Tier

DECODE = NodeInfo("127.0.0.1:1", "d0", Role.DECODE, "tiny", block_tokens=16, total_blocks=100)
PREFILL = NodeInfo("127.0.0.1:2", "p0", Role.PREFILL, "tiny", block_tokens=16, total_blocks=100)


def test_prefill_queue_wait_is_the_remaining_fifo_work() -> None:
    led = Ledger()
    led.start_prefill("p0", "a", tokens=100, predicted_s=2.0, now=10.0)
    led.start_prefill("p0", "b", tokens=50, predicted_s=1.0, now=10.5)
    state = led.node_state(PREFILL, now=11.5)
    # a has 0.5 s left (started at 10.0, runs 2.0 s), then b's 1.0 s
    assert state.est_queue_wait_s == pytest.approx(1.5)
    assert state.queued_prefill_tokens == 150
    assert (state.kv_capacity_tokens, state.kv_free_tokens) == (0, 0)
    assert led.finish_prefill("p0", "a") and not led.finish_prefill("p0", "a")
    assert led.node_state(PREFILL, now=20.0).est_queue_wait_s == 0.0  # b overdue: no wait
    led.check_integrity()


def test_decode_streams_reserve_kv_and_grow_their_context() -> None:
    led = Ledger()
    led.start_decode("d0", "a", prompt_tokens=40, max_tokens=10)
    led.start_decode("d0", "b", prompt_tokens=100, max_tokens=60)
    led.add_tokens("d0", "a", 3)
    state = led.node_state(DECODE, now=0.0)
    assert state.running_decode_seqs == 2
    assert state.decode_context_tokens == 43 + 100
    assert state.kv_capacity_tokens == 1600
    assert state.kv_free_tokens == 1600 - 50 - 160
    led.add_tokens("d0", "a", 100)  # never beyond its reservation
    assert led.load("d0", 0.0).context_tokens == 50 + 100
    led.check_integrity()
    assert led.finish_decode("d0", "a") and led.finish_decode("d0", "b")
    assert led.idle()
    assert led.load("d0", 0.0).routed_decodes == 2


def test_ledger_rejects_duplicates_and_unknown_streams() -> None:
    led = Ledger()
    led.start_decode("d0", "a", 10, 1)
    with pytest.raises(ExistsError):
        led.start_decode("d0", "a", 10, 1)
    with pytest.raises(NotFoundError):
        led.add_tokens("d0", "zzz", 1)


def test_match_answer_counts_each_block_in_its_fastest_tier() -> None:
    runs = [Run("s1", Tier.DRAM, 3), Run("s1", Tier.SSD, 5), Run("s2", Tier.HBM, 2)]
    index = MatchAnswerIndex(runs, pool_length=6)
    assert index.match([]) == {
        "s1": PrefixMatch(5, {Tier.DRAM: 3, Tier.SSD: 2}),
        "s2": PrefixMatch(2, {Tier.HBM: 2}),
    }
    # from s1: blocks 0-2 DRAM and 3-4 SSD are its own; block 5 only the pool as a whole has
    split = index.prefix("s1", [])
    assert (split.local, split.remote) == ({Tier.DRAM: 3, Tier.SSD: 2}, {Tier.DRAM: 1})
    # from a serving node holding nothing: all 6 are remote, each from its fastest copy
    # (0-1 HBM on s2, 2 DRAM on s1, 3-4 SSD on s1, 5 spread over the pool: DRAM)
    split = index.prefix("prefill-0", [])
    assert split.local == {}
    assert split.remote == {Tier.HBM: 2, Tier.DRAM: 2, Tier.SSD: 2}


def test_empty_match_answer_and_bad_lengths() -> None:
    empty = MatchAnswerIndex([], 0)
    assert empty.match([]) == {} and empty.prefix("x", []).remote == {}
    with pytest.raises(BadRequestError):
        MatchAnswerIndex([Run("s", Tier.DRAM, -1)], 0)


def test_identity_keys_are_the_prefill_nodes_last_written_keys() -> None:
    from kvstore.serving.config import ServingConfig, namespace

    tokens = list(range(1, 40))
    layered = KeyIdentity("tiny", 0, True, 4, 16, "layer", "float32")
    hashes = layered.hashes(tokens)
    assert hashes == block_hashes(tokens, 16, namespace(ServingConfig(block_tokens=16)))
    assert layered.keys(hashes) == [f"{h.hex()}/L3" for h in hashes]  # tiny: 4 layers
    per_block = KeyIdentity("tiny", 0, True, 4, 16, "block", "float32")
    assert per_block.keys(hashes) == [h.hex() for h in hashes]
    batched = KeyIdentity("tiny", 0, False, 4, 16, "layer", "float32")
    other = namespace(ServingConfig(block_tokens=16, batch_invariant=False))
    assert batched.hashes(tokens) == block_hashes(tokens, 16, other) != hashes


def test_identity_book_pins_the_first_node_and_refuses_a_different_one() -> None:
    book = IdentityBook()
    base = KeyIdentity("tiny", 0, True, 4, 16, "layer", "float32")
    assert book.admit("a:1", base) == ""
    assert book.admit("a:2", base) == ""
    why = book.admit("a:3", KeyIdentity("tiny", 1, False, 4, 16, "layer", "float32"))
    assert why == (
        "a:3 refused: its pool keys would differ from a:1's (model 'tiny'): "
        "seed 1 != 0, batch_invariant False != True"
    )
    small = KeyIdentity("small", 7, True, 8, 32, "block", "float32")  # another model pins its own
    assert book.admit("a:4", small) == "" and book.of("small") == small
    assert book.of("tiny") == base and book.of("big") is None


def test_identity_overrides_refuse_nodes_that_differ_from_a_stated_value() -> None:
    book = IdentityBook(IdentityOverrides(seed=3, kv_objects="block"))
    why = book.admit("a:1", KeyIdentity("tiny", 0, True, 4, 16, "layer", "float32"))
    told = "seed 0 (told 3), kv_objects 'layer' (told 'block')"
    assert why == f"a:1 refused: its pool keys would differ: {told}"
    assert book.of("tiny") is None  # a refused node pins nothing
    assert book.admit("a:2", KeyIdentity("tiny", 3, False, 4, 16, "block", "float32")) == ""
    with pytest.raises(BadRequestError):
        KeyIdentity("tiny", 0, True, 4, 16, "page", "float32")


def test_conductor_config_is_validated() -> None:
    with pytest.raises(BadRequestError, match="valid: cache_load"):
        ConductorConfig(policy="fastest")
    with pytest.raises(BadRequestError, match="distinct"):
        ConductorConfig(prefill=("a:1",), decode=("a:1",))
    with pytest.raises(BadRequestError):
        ConductorConfig(refresh_s=0)
    with pytest.raises(BadRequestError, match="kv_objects"):
        ConductorConfig(kv_objects="page")
    with pytest.raises(BadRequestError, match=">= 0"):
        ConductorConfig(seed=-1)
    assert ConductorConfig(seed=2).overrides == IdentityOverrides(seed=2)


def test_local_prefill_override_only_lowers_a_nodes_own_limit() -> None:
    from kvstore.conductor.nodes import _local_limit

    assert (_local_limit(64, None), _local_limit(64, 32), _local_limit(64, 128)) == (64, 32, 64)
