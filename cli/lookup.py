"""`kvstore lookup`: which prefix of a prompt the pool holds, per node and tier.

The pool keys of a prompt depend on the serving nodes' identity (model, seed, block
size, layers, object shape, KV dtype); it is read from a serving node's Stats as the
conductor reports it (ClusterStatus), so the keys are exactly the ones the prefill
nodes write. Then one MatchPrefix on the master.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

import grpc

from cli.common import cli_settings, tier_name
from cli.master_api import MasterApi
from kvstore.edge import rpc_error, sync_channel
from kvstore.errors import BadRequestError, NotFoundError, UnavailableError
from kvstore.v1 import conductor_pb2, conductor_pb2_grpc, master_pb2


def prompt_tokens(args: argparse.Namespace) -> list[int]:
    """The prompt as the serving nodes tokenize it (byte tokenizer, BOS first)."""
    if args.prompt is not None:
        from kvstore.model.tokenizer import ByteTokenizer

        return ByteTokenizer().encode(args.prompt)
    try:
        text = Path(args.tokens).read_text()
    except OSError as exc:
        raise BadRequestError(f"cannot read --tokens {args.tokens!r}: {exc.strerror}") from None
    try:
        return [int(t) for t in re.split(r"[\s,]+", text.strip()) if t]
    except ValueError:
        raise BadRequestError(f"--tokens {args.tokens!r}: not a list of integers") from None


def node_identity(conductor: str, model: str, timeout_s: float) -> Any:
    """The KeyIdentity of the first healthy node serving `model` ("" = any)."""
    from kvstore.conductor.identity import KeyIdentity

    with sync_channel(conductor) as ch:
        try:
            status = conductor_pb2_grpc.ConductorStub(ch).ClusterStatus(
                conductor_pb2.ClusterStatusRequest(), timeout=timeout_s
            )
        except grpc.RpcError as err:
            exc = rpc_error(err)
            if isinstance(exc, UnavailableError):
                raise UnavailableError(f"conductor {conductor} unavailable") from None
            raise exc from None
    for node in status.nodes:
        if node.healthy and (not model or node.model_id == model):
            report = node.report
            wanted = {f.name for f in dataclasses.fields(KeyIdentity)}
            values = {
                "model_id": report.model_id, "seed": report.seed,
                "batch_invariant": report.batch_invariant, "num_layers": report.num_layers,
                "block_tokens": report.block_tokens, "kv_objects": report.kv_objects,
                "kv_dtype": getattr(report, "kv_dtype", "") or "float32",
            }  # fmt: skip
            return KeyIdentity(**{k: v for k, v in values.items() if k in wanted})
    raise NotFoundError(f"no healthy serving node {'of ' + model if model else ''} at {conductor}")


def lookup(args: argparse.Namespace) -> dict[str, Any]:
    cfg = cli_settings(args)
    tokens = prompt_tokens(args)
    identity = node_identity(cfg.conductor, args.model, cfg.timeout_s)
    keys = identity.keys(identity.hashes(tokens, getattr(args, "tenant", "")))
    with MasterApi(cfg.master, cfg.timeout_s) as api:
        answer = api.call("MatchPrefix", master_pb2.MatchPrefixRequest(keys=keys))
    bt = identity.block_tokens
    matches = [
        {"node_id": m.node_id, "tier": tier_name(m.tier), "blocks": m.length,
         "tokens": m.length * bt}
        for m in answer.matches
    ]  # fmt: skip
    return {
        "model": identity.model_id, "prompt_tokens": len(tokens), "block_tokens": bt,
        "blocks": len(keys), "pool_blocks": answer.pool_length,
        "pool_tokens": answer.pool_length * bt, "matches": matches,
    }  # fmt: skip
