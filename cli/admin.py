"""Admin commands against a running master (tables for people, `--json` for scripts):

    kvstore status                      cluster health in one screen
    kvstore nodes                       nodes, endpoints, heartbeat age, capacity
    kvstore ls [PREFIX] [--limit N]     objects in key order, paged (--page-token)
    kvstore inspect KEY                 replicas, tiers, size, checksum, leases, pins, age
    kvstore lookup --prompt TEXT | --tokens FILE --conductor ADDR [--model M] [--tenant T]
                                        prefix match of a prompt per node and tier
    kvstore rm KEY... [--force]         remove (a lease or pin refuses it unless --force)
    kvstore pin KEY... [--ttl-s S]      soft pin; kvstore unpin KEY...
    kvstore evict KEY... | --prefix P | --tier T --watermark W  [--force] [--dry-run]
    kvstore drain NODE [--force]        (cli/drain.py)
    kvstore uncordon NODE               new replicas may go to a drained node again

Exit codes: cli/errors.py (0 ok, 2 usage, 3 not found, 4 unavailable, 5 refused, ...).
"""

from __future__ import annotations

import argparse
from typing import Any

from cli.common import admin_parent, emit, master_api, parse_tier, table, tier_name
from cli.errors import guarded
from cli.tiers_view import human_bytes
from kvstore.errors import BadRequestError
from kvstore.rpc_errors import error_for
from kvstore.v1 import master_pb2


def register(sub: argparse._SubParsersAction) -> None:
    parent = admin_parent()

    def add(name: str, help_: str, handler: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, parents=[parent])
        p.set_defaults(handler=guarded(f"kvstore {name}", handler))
        return p

    add("status", "cluster health in one screen", run_status)
    add("nodes", "nodes, endpoints, heartbeat age, capacity", run_nodes)
    p = add("ls", "list objects (paged)", run_ls)
    p.add_argument("prefix", nargs="?", default="")
    p.add_argument("--limit", type=int, default=100, help="objects per page (1..10000)")
    p.add_argument("--page-token", default="", help="from the previous page's footer")
    p.add_argument("--all", action="store_true", help="every page")
    p = add("inspect", "everything the master knows about one key", run_inspect)
    p.add_argument("key")
    p = add("lookup", "prefix match of a prompt per node and tier", run_lookup)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (byte tokenizer, BOS added, as the nodes do)")
    src.add_argument("--tokens", help="file of token ids (whitespace or comma separated)")
    p.add_argument("--conductor", default=None, help="HOST:PORT: where the key identity comes from")
    p.add_argument("--model", default="", help="model id (default: the first node's)")
    p.add_argument("--tenant", default="", help="the requests' tenant (salts the block hashes)")
    p = add("rm", "remove keys", run_rm)
    p.add_argument("keys", nargs="+")
    p.add_argument("--force", action="store_true", help="ignore leases and pins")
    p = add("pin", "soft-pin keys against eviction", run_pin)
    p.add_argument("keys", nargs="+")
    p.add_argument("--ttl-s", type=float, default=0.0, help="0 = the master's maximum")
    p = add("unpin", "lift pins", run_unpin)
    p.add_argument("keys", nargs="+")
    p = add("evict", "evict keys, a prefix, or a tier down to a watermark", run_evict)
    p.add_argument("keys", nargs="*")
    p.add_argument("--prefix", default="")
    p.add_argument("--tier", default=None, help="dram | ssd | hbm (with --watermark)")
    p.add_argument("--watermark", type=float, default=None, help="fraction of the tier, 0..1")
    p.add_argument("--force", action="store_true", help="keys/prefix: ignore leases and pins")
    p.add_argument("--dry-run", action="store_true", help="say what would go, change nothing")
    from cli import drain

    p = add("drain", "move a node's objects away, then unmount its segments", drain.run)
    drain.add_arguments(p)
    p = add("uncordon", "let new replicas go to a drained (cordoned) node again", run_uncordon)
    p.add_argument("node")


# ---- status and nodes -------------------------------------------------------


def stats_doc(stats: master_pb2.StatsResponse, master: str) -> dict[str, Any]:
    """The pool at a glance (the document behind `status`)."""
    tiers: dict[str, dict[str, int]] = {}
    for s in stats.segments:
        t = tiers.setdefault(tier_name(s.tier), {"capacity": 0, "used": 0, "objects": 0})
        t["capacity"] += s.capacity
        t["used"] += s.used
        t["objects"] += s.objects
    lookups = stats.hits + stats.misses
    moves = {k: getattr(stats, k, 0) for k in ("offloads", "promotions", "corrupt_replicas")}
    return {
        "master": master, "epoch": stats.master_epoch, "nodes": len(stats.nodes),
        "capacity": stats.capacity, "used": stats.used, "objects": stats.complete,
        "writing": stats.writing, "hits": stats.hits, "misses": stats.misses,
        "hit_ratio": stats.hits / lookups if lookups else 0.0, "evictions": stats.evictions,
        "dead_nodes": stats.dead_nodes, "dropped_replicas": stats.dropped_replicas,
        "tiers": tiers, **moves,
    }  # fmt: skip


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def status_text(d: dict[str, Any]) -> str:
    lines = [
        f"master {d['master']}  epoch {d['epoch'][:12]}  nodes {d['nodes']} alive, "
        f"{d['dead_nodes']} declared dead",
        f"pool   {human_bytes(d['used'])} / {human_bytes(d['capacity'])} used "
        f"({_pct(d['used'], d['capacity'])}); {d['objects']} objects, {d['writing']} puts "
        "in flight",
        f"reads  {d['hits']} hits, {d['misses']} misses (hit ratio {100 * d['hit_ratio']:.1f}%); "
        f"{d['evictions']} evicted, {d['offloads']} offloads, {d['promotions']} promotions, "
        f"{d['corrupt_replicas']} corrupt replicas dropped",
    ]
    for name, t in sorted(d["tiers"].items()):
        lines.append(
            f"  {name:<5} {human_bytes(t['used']):>10} / {human_bytes(t['capacity']):<10} "
            f"{_pct(t['used'], t['capacity']):>6}  {t['objects']} objects"
        )
    health = "OK" if d["nodes"] and d["capacity"] else "DEGRADED: no storage node mounted"
    lines.append(f"health {health}")
    return "\n".join(lines)


def run_status(args: argparse.Namespace) -> int:
    with master_api(args) as api:
        stats = api.call("Stats", master_pb2.StatsRequest())
        doc = stats_doc(stats, api.address)
    emit(args, doc, status_text(doc))
    return 0


def nodes_doc(stats: master_pb2.StatsResponse) -> list[dict[str, Any]]:
    out = []
    for n in stats.nodes:
        segs = [s for s in stats.segments if s.node_id == n.node_id]
        out.append({
            "node_id": n.node_id, "tcp_address": n.endpoint.tcp_address,
            "rpc_address": n.endpoint.rpc_address, "ms_since_heartbeat": n.ms_since_heartbeat,
            "segments": [f"{s.segment}:{tier_name(s.tier)}" for s in segs],
            "capacity": sum(s.capacity for s in segs), "used": sum(s.used for s in segs),
            "objects": sum(s.objects for s in segs),
        })  # fmt: skip
    return out


def run_nodes(args: argparse.Namespace) -> int:
    with master_api(args) as api:
        doc = nodes_doc(api.call("Stats", master_pb2.StatsRequest()))
    rows = [
        (d["node_id"], d["tcp_address"], f"{d['ms_since_heartbeat']} ms",
         ",".join(d["segments"]) or "-", human_bytes(d["capacity"]), human_bytes(d["used"]),
         str(d["objects"]))
        for d in doc
    ]  # fmt: skip
    head = ("node", "data plane", "heartbeat", "segments", "capacity", "used", "objects")
    emit(args, doc, table(head, rows, right_from=2) if rows else "no nodes registered")
    return 0


# ---- objects ----------------------------------------------------------------


def object_doc(o: master_pb2.ObjectInfo) -> dict[str, Any]:
    return {
        "key": o.key, "size": o.size, "state": master_pb2.ObjectState.Name(o.state)[13:],
        "group": o.group, "checksum": f"{o.checksum:016x}" if o.checksum else "",
        "replicas": [
            {"node_id": r.node_id, "tier": tier_name(r.tier), "segment": r.segment,
             "offset": r.offset, "length": r.length}
            for r in o.replicas
        ],
        "lease_ms_left": o.lease_ms_left, "pin_ms_left": o.pin_ms_left,
    }  # fmt: skip


def _where(d: dict[str, Any]) -> str:
    return ",".join(f"{r['node_id']}:{r['tier']}" for r in d["replicas"])


def run_ls(args: argparse.Namespace) -> int:
    if not 0 < args.limit <= 10_000:
        raise BadRequestError(f"--limit must be in 1..10000, got {args.limit}")
    objects: list[dict[str, Any]] = []
    token = args.page_token
    with master_api(args) as api:
        while True:
            request = master_pb2.ListObjectsRequest(
                page_size=args.limit, page_token=token, prefix=args.prefix
            )
            page = api.call("ListObjects", request)
            objects += [object_doc(o) for o in page.objects]
            token = page.next_page_token
            if not args.all or not token:
                break
    rows = [
        (d["key"], human_bytes(d["size"]), d["state"], _where(d),
         f"{d['lease_ms_left']} ms", f"{d['pin_ms_left']} ms")
        for d in objects
    ]  # fmt: skip
    head = ("key", "size", "state", "replicas", "lease", "pin")
    text = table(head, rows, right_from=1) if rows else "no objects"
    if token:
        text += f"\nmore: kvstore ls {args.prefix} --page-token {token}".replace("  ", " ")
    emit(args, {"objects": objects, "next_page_token": token}, text)
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    with master_api(args) as api:
        res = api.call("Inspect", master_pb2.InspectRequest(key=args.key))
    d = object_doc(res.object)
    d.update(
        age_ms=res.age_ms, hits=res.hits, writer=res.writer, group_members=res.group_members,
        lease_holder=res.lease_holder,
    )  # fmt: skip
    lines = [
        f"key       {d['key']}",
        f"size      {human_bytes(d['size'])} ({d['size']} bytes), {d['state']}",
        f"checksum  {d['checksum'] or 'not recorded'}",
        f"group     {d['group']} ({d['group_members']} members)",
        f"age       {d['age_ms'] / 1000:.1f} s, written by {d['writer'] or '(restored)'}",
        f"lease     {d['lease_ms_left']} ms left"
        + (f", held by {d['lease_holder']}" if d["lease_holder"] else ""),
        f"pin       {d['pin_ms_left']} ms left",
        "replicas:",
        *(
            f"  {r['node_id']:<16} {r['tier']:<5} {r['segment']} @{r['offset']} +{r['length']}"
            for r in d["replicas"]
        ),
    ]
    emit(args, d, "\n".join(lines))
    return 0


# ---- rm / pin / unpin / evict -----------------------------------------------


def _statuses(keys: list[str], results: Any) -> tuple[list[dict[str, str]], Exception | None]:
    out, first = [], None
    for key, st in zip(keys, results, strict=True):
        err = error_for(st.code, st.message)
        out.append({"key": key, "error": str(err) if err else ""})
        first = first or err
    return out, first


def _report(args: argparse.Namespace, verb: str, keys: list[str], results: Any) -> int:
    doc, first = _statuses(keys, results)
    lines = [f"{verb} {d['key']}" if not d["error"] else f"failed {d['key']}: {d['error']}"
             for d in doc]  # fmt: skip
    emit(args, {"results": doc}, "\n".join(lines))
    if first is not None:
        raise first
    return 0


def run_rm(args: argparse.Namespace) -> int:
    with master_api(args) as api:
        res = api.call("Remove", master_pb2.RemoveRequest(keys=args.keys, force=args.force))
    return _report(args, "removed", args.keys, res.results)


def run_pin(args: argparse.Namespace) -> int:
    if args.ttl_s < 0:
        raise BadRequestError("--ttl-s must be >= 0")
    with master_api(args) as api:
        res = api.call("Pin", master_pb2.PinRequest(keys=args.keys, ttl_ms=int(args.ttl_s * 1000)))
    return _report(args, f"pinned for {res.ttl_ms / 1000:g} s:", args.keys, res.results)


def run_unpin(args: argparse.Namespace) -> int:
    with master_api(args) as api:
        res = api.call("Unpin", master_pb2.UnpinRequest(keys=args.keys))
    return _report(args, "unpinned", args.keys, res.results)


def evict_request(args: argparse.Namespace) -> master_pb2.EvictRequest:
    from kvstore.master.admin import EvictSpec  # validates the combination, grpc-free

    tier = parse_tier(args.tier) if args.tier else None
    if (tier is None) != (args.watermark is None):
        raise BadRequestError("--tier and --watermark go together")
    spec = EvictSpec(
        tuple(args.keys), args.prefix, tier, args.watermark or 0.0, args.force, args.dry_run
    )
    request = master_pb2.EvictRequest(
        keys=spec.keys, prefix=spec.prefix, watermark=spec.watermark, force=spec.force,
        dry_run=spec.dry_run,
    )  # fmt: skip
    if tier is not None:
        request.tier = int(tier)
    return request


def run_evict(args: argparse.Namespace) -> int:
    request = evict_request(args)
    with master_api(args) as api:
        res = api.call("Evict", request)
    doc = {
        "evicted": res.evicted, "freed_bytes": res.freed_bytes, "skipped": res.skipped,
        "missing": res.missing, "keys": list(res.keys), "dry_run": args.dry_run,
    }  # fmt: skip
    verb = "would evict" if args.dry_run else "evicted"
    text = (
        f"{verb} {res.evicted} objects ({human_bytes(res.freed_bytes)}); skipped {res.skipped} "
        f"(leased, pinned or being written); {res.missing} unknown"
    )
    emit(args, doc, text)
    return 0


# ---- lookup -----------------------------------------------------------------


def run_lookup(args: argparse.Namespace) -> int:
    from cli.lookup import lookup

    doc = lookup(args)
    rows = [(m["node_id"], m["tier"], str(m["blocks"]), str(m["tokens"])) for m in doc["matches"]]
    text = "\n".join(
        [
            f"prompt {doc['prompt_tokens']} tokens = {doc['blocks']} full blocks of "
            f"{doc['block_tokens']}; model {doc['model']}",
            f"pool: {doc['pool_blocks']} leading blocks cached ({doc['pool_tokens']} tokens)",
            table(("node", "tier", "blocks", "tokens"), rows, right_from=2) if rows else "",
        ]
    ).rstrip()
    emit(args, doc, text)
    return 0


def run_uncordon(args: argparse.Namespace) -> int:
    with master_api(args) as api:
        res = api.call("Cordon", master_pb2.CordonRequest(node_id=args.node, cordon=False))
    cordoned = list(res.cordoned)
    emit(args, {"node": args.node, "cordoned": cordoned},
         f"uncordoned {args.node}; cordoned now: {', '.join(cordoned) or 'none'}")  # fmt: skip
    return 0
