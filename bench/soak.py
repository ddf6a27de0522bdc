"""Soak: many clients against a 3-master (etcd), 3-node pool for a while.

    python bench/soak.py [--seconds 1800] [--clients 8] [--ci] [--kill-leader-every S] [--json]
                         [--keep-workdir] [--no-serving] [--burst-every 30] [--burst-size 32]

Each client thread loops: put a fresh key (4 KiB, deterministic bytes), read back one of
its recent keys, now and then remove one. The pool is smaller than what is written,
so eviction runs throughout (a NoSpaceError is backpressure: counted, never fatal).
Every `--sample-s` (2 s) the RSS of every process (masters, nodes, etcd, this one) is
sampled, with its RssAnon (heap; the rest is mapped files, e.g. etcd's bbolt, and shared
memory). The slope of each (MiB/min, bench/rss_slope.py): the Theil-Sen slope (the
median of every pair's) of the samples after a warm-up of the first third of the run
(`warmup_s` in the JSON: 100 s of a `--ci` run, 600 s of a 30-minute one), so that a
burst's spikes and a collector's dips do not tilt it; `rss_lsq_slope_mib_per_min` is
the least-squares line through the same samples (the figure of the runs before
2026-12-02, then after the first quarter). A master elected after the warm-up (a
takeover: it loads the whole index, ~25 MiB at once) and etcd (which serves that load)
are reported in `rss_slope_not_judged`, not judged. The
file (not the `--json` line) also holds every curve (`rss_samples`: [s, RSS MiB,
RssAnon MiB]). At the end every key a client still believes present is read: a wrong
byte is an integrity failure; a missing key must have been evicted (the master counts
evictions: they cover the keys missing at the end plus those a client found evicted
while running, a probe's get answered NotFound or a remove that found nothing; they
also count the serving workload's KV blocks and any put whose outcome a client never
learnt, so they are an upper bound, `evictions_of_other_objects` the rest). That
belief is one byte per put (`Worker.present`, a bytearray by key number), so this
process's own bookkeeping grows ~0.02 MiB/min and its RSS slope is the clients'.
With the serving workload (on by default; `--no-serving` leaves it out) the same pool
also serves: a prefill node and a decode node (the reference engine's tiny model,
given the masters' HA list) behind a conductor (also given the list). A driver thread
sends a steady stream of generate requests through `ConductorClient` (4 shared 64-token
prefixes x 6 suffixes; a prompt must always get the same greedy tokens), and every
`--burst-every` seconds `--burst-size` requests arrive at once, each with a TTFT
objective a deep prefill queue misses and together far more KV than the decode node's
32 blocks hold, so the conductor's admission control rejects some (RESOURCE_EXHAUSTED,
`retry-after-ms` trailing metadata and "retry after Xs" in the message): each
rejection must carry a hint and is retried after it; no untyped error, no process
dies. Their RSS is sampled as the others'.
`--ci` is a 5-minute run, the one CI runs with every target asserted
(tests/ha/test_benches.py::test_soak_5_minutes). Targets (issue 11): RSS slope of every
process < 1 MiB/min after warm-up, 0 integrity failures (docs/reliability.md,
"bench/soak.py", for what a short run can and cannot judge). Writes
bench/results/soak.json. The temporary directory (etcd's data, the processes' logs) is
removed at the end unless --keep-workdir.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What CI runs. 5 minutes, not 3: since the pool places extents in fragmented segments
# (2026-12-03) the soak writes ~1.5x the journal records per second, and etcd's RSS,
# creeping ~0.5 MiB/min at that rate, read 0.8 and 1.4 over the 2 minutes after a 3-min
# run's warm-up, 0.5-0.6 over 200 s (docs/reliability.md, "bench/soak.py").
CI_SECONDS = 300.0
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from bench.rss_slope import (  # noqa: E402
    least_squares_mib_per_min,
    rss_mib,
    rss_slope_mib_per_min,
    warmup_s,
)
from kvstore.client import Client  # noqa: E402
from kvstore.client.conductor import ConductorClient, GenerateOptions, build_request  # noqa: E402
from kvstore.edge import rpc_error  # noqa: E402
from kvstore.errors import CorruptError, KVStoreError, NoSpaceError, NotFoundError  # noqa: E402
from kvstore.v1 import conductor_pb2_grpc  # noqa: E402
from tests.cluster import START_TIMEOUT_S, child_env, stop_process  # noqa: E402
from tests.ha.etcd import Etcd, find_etcd  # noqa: E402
from tests.ha.hacluster import HACluster  # noqa: E402
from tests.ha.storm import value_of  # noqa: E402

VALUE = 4096


class Worker(threading.Thread):
    def __init__(self, address: str, w: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.address, self.w, self.stop = address, w, stop
        self.present = bytearray()  # by key number: 1 = put and not known gone
        self.recent: list[int] = []
        # keys found evicted while running (a probe's get NotFound, a remove that found
        # nothing): the master counted them, the final check will not find them missing
        self.seen_evicted = 0
        self.counts = {"put": 0, "get": 0, "remove": 0, "no_space": 0, "errors": 0}
        self.error_types: set[str] = set()
        self.untyped: list[str] = []
        self.rng = random.Random(w)

    def run(self) -> None:
        with Client(self.address, failover_timeout_s=30) as c:
            n = 0
            while not self.stop.is_set():
                try:
                    self.step(c, n)
                except NoSpaceError:
                    self.counts["no_space"] += 1
                    time.sleep(0.05)  # back off as the error asks
                except KVStoreError as exc:
                    self.counts["errors"] += 1
                    self.error_types.add(type(exc).__name__)
                except Exception as exc:  # recorded: the run fails on any
                    self.untyped.append(repr(exc))
                n += 1

    def key(self, n: int) -> str:
        return f"soak/w{self.w}/{n}"

    def step(self, c: Client, n: int) -> None:
        self.present.append(0)
        c.put(self.key(n), value_of(self.key(n), VALUE))
        self.present[n] = 1
        self.recent = [*self.recent[-63:], n]
        self.counts["put"] += 1
        probe = self.rng.choice(self.recent)
        try:
            got = c.get(self.key(probe))
            self.counts["get"] += 1
            if got != value_of(self.key(probe), VALUE):
                raise CorruptError(f"{self.key(probe)} read back wrong bytes")
        except NotFoundError:
            self.seen_evicted += self.present[probe]
            self.present[probe] = 0  # evicted
        if self.rng.random() < 0.05:
            gone = self.recent.pop(0)
            if self.present[gone]:
                if c.remove(self.key(gone)):
                    self.counts["remove"] += 1
                else:
                    self.seen_evicted += 1  # evicted before its remove
            self.present[gone] = 0


def integrity(address: str, workers: list[Worker]) -> dict[str, int]:
    ok = missing = bad = 0
    with Client(address, failover_timeout_s=30) as c:
        for w in workers:
            keys = [w.key(n) for n, there in enumerate(w.present) if there]
            for i in range(0, len(keys), 256):
                part = keys[i : i + 256]
                try:
                    values = c.batch_get(part)
                except CorruptError:
                    bad += len(part)
                    continue
                for key, got in zip(part, values, strict=True):
                    if got is None:
                        missing += 1
                    elif got == value_of(key, VALUE):
                        ok += 1
                    else:
                        bad += 1
    return {"verified": ok, "evicted": missing, "integrity_failures": bad}


PREFIXES, SUFFIXES = 4, 6  # 24 prompts; each prefix 4 full blocks, shared by 6 suffixes
DECODE_BLOCKS = 32  # the decode node's KV: 512 tokens, 4 burst requests at once
HINT_RE = re.compile(r"retry after ([0-9.]+)s")
GIVE_UP_S = 90.0  # a rejected request is retried for this long


def prompt_of(i: int) -> list[int]:
    p, s = divmod(i % (PREFIXES * SUFFIXES), SUFFIXES)
    prefix = [(31 * p + 7 * j + 3) % 256 for j in range(64)]
    return prefix + [(11 * s + 5 * j + p + 1) % 256 for j in range(20)]


class ServingLoad:
    """The serving workload's driver: a steady stream (ConductorClient) and bursts
    (the raw stub, to read the `retry-after-ms` trailing metadata of a rejection)."""

    def __init__(self, conductor: str, stop: threading.Event, args: argparse.Namespace) -> None:
        self.stop, self.args = stop, args
        self.client = ConductorClient(conductor, deadline_s=60.0)
        self.channel = grpc.insecure_channel(conductor)
        self.stub = conductor_pb2_grpc.ConductorStub(self.channel)
        self.lock = threading.Lock()
        self.counts = {
            "requests_ok": 0, "requests_failed": 0, "steady_ok": 0, "burst_ok": 0,
            "bursts": 0, "burst_requests": 0, "rejections": 0, "rejections_with_hint": 0,
            "hint_metadata_mismatch": 0, "retries_then_ok": 0, "given_up": 0,
            "token_mismatches": 0, "rejected_at_stop": 0, "rejected_ttft": 0, "rejected_kv": 0,
            "rejected_other": 0, "steady_conductor_matched": 0, "steady_prefill_cached": 0,
            "max_attempts": 0,
        }  # fmt: skip
        self.error_types: set[str] = set()
        self.untyped: list[str] = []
        self.tokens: dict[tuple[int, int], tuple[int, ...]] = {}  # (prompt, max_tokens) ->
        self.idle_ttft_s = 0.0  # the conductor's TTFT prediction for a steady request
        self.threads: list[threading.Thread] = []

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] += n

    def start(self) -> None:
        for target in (self.steady, self.bursts):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self.threads.append(t)

    def join(self, timeout_s: float) -> None:
        for t in self.threads:
            t.join(timeout_s)

    def close(self) -> None:
        self.client.close()
        self.channel.close()

    def check(self, i: int, tokens: tuple[int, ...]) -> None:
        """The same prompt and length always get the same greedy tokens."""
        with self.lock:
            want = self.tokens.setdefault((i % (PREFIXES * SUFFIXES), len(tokens)), tokens)
            if tokens != want or not tokens:
                self.counts["token_mismatches"] += 1

    def one(self, i: int, kind: str, max_tokens: int) -> None:
        """One request until it completes, retrying each rejection after its hint (times
        1-1.5, so a burst's rejected requests do not all come back at once) for at most
        GIVE_UP_S: a hint is the predicted wait, not a reservation, so a retry can be
        rejected again by the others'."""
        rejected, start, attempts = False, time.monotonic(), 0
        rng = random.Random(i)
        while True:
            attempts += 1
            try:
                hint = self.attempt(i, kind, max_tokens)
            except KVStoreError as exc:
                self.add("requests_failed")
                with self.lock:
                    self.error_types.add(type(exc).__name__)
                return
            except Exception as exc:  # recorded: the run fails on any
                self.add("requests_failed")
                with self.lock:
                    self.untyped.append(repr(exc))
                return
            if hint is None:  # done
                self.add("requests_ok")
                self.add(f"{kind}_ok")
                with self.lock:
                    self.counts["max_attempts"] = max(self.counts["max_attempts"], attempts)
                if rejected:
                    self.add("retries_then_ok")
                return
            rejected = True
            if hint < 0 or time.monotonic() - start > GIVE_UP_S:  # no retry helps / too long
                break
            if self.stop.is_set():  # the soak is over: not retried, not a failure
                self.add("rejected_at_stop")
                return
            time.sleep(min(max(hint, 0.01), 5.0) * rng.uniform(1.0, 1.5))
        self.add("given_up")

    def attempt(self, i: int, kind: str, max_tokens: int) -> float | None:
        """None when it completed; else the rejection's retry hint (-1: none)."""
        prompt = prompt_of(i)
        if kind == "steady":
            try:
                out = self.client.generate(prompt, max_tokens=max_tokens)
            except NoSpaceError as exc:  # the client keeps only the message's hint
                return self.rejection(exc, None)
            self.check(i, tuple(out.token_ids))
            if out.placement is not None:
                self.idle_ttft_s = self.idle_ttft_s or out.placement.predicted_ttft_s
                if out.placement.cached_blocks:  # its MatchPrefix reached the HA masters
                    self.add("steady_conductor_matched")
            if out.timings is not None and out.timings.cached_tokens:
                self.add("steady_prefill_cached")  # the prefix came from the pool
            return None
        # a burst request's TTFT objective: 4x what the conductor predicts for an idle
        # steady one, so a deep prefill queue misses it (KV space rejects the rest)
        slo = 4 * self.idle_ttft_s
        request = build_request(prompt, GenerateOptions(max_tokens=max_tokens, ttft_slo_s=slo))
        call = self.stub.Generate(request, timeout=60.0)
        try:
            tokens = tuple(t for msg in call for t in msg.token_ids)
        except grpc.RpcError as err:
            # `err` is `call` (a grpc call is its own error), held by this frame, which
            # err's traceback holds: a reference cycle per rejected attempt (~20 per
            # burst request) for a full collection to free; without the traceback, none
            err.__traceback__ = None
            exc = rpc_error(err)
            if not isinstance(exc, NoSpaceError):
                raise exc from None
            meta = dict(call.trailing_metadata() or ())
            ms = meta.get("retry-after-ms")
            return self.rejection(exc, None if ms is None else float(ms) / 1000)
        self.check(i, tokens)
        return None

    def rejection(self, exc: NoSpaceError, meta_s: float | None) -> float:
        """Count a RESOURCE_EXHAUSTED; its hint in seconds (-1 when it carries none)."""
        self.add("rejections")
        text = str(exc)
        reason = "ttft" if "TTFT" in text else "kv" if "KV tokens" in text else "other"
        self.add(f"rejected_{reason}")
        found = HINT_RE.search(text)
        text_s = float(found.group(1)) if found else None
        if text_s is None and meta_s is None:
            return -1.0
        self.add("rejections_with_hint")
        if meta_s is not None and (text_s is None or abs(meta_s - text_s) > 0.002):
            self.add("hint_metadata_mismatch")  # ceil to ms vs the message's 3 decimals
        return meta_s if meta_s is not None else float(text_s or 0.0)

    def steady(self) -> None:
        n = 0
        while not self.stop.is_set():
            self.one(n, "steady", 8)
            n += 1
            time.sleep(0.05)

    def bursts(self) -> None:
        """A burst every `--burst-every` s, each request on a thread of one pool that lives
        as long as the run: 32 new threads a burst would give this process 32 new
        stacks and malloc arenas each time, a +1 MiB spike of its RSS that is the
        harness's, not the clients'."""
        every, size = self.args.burst_every, self.args.burst_size
        next_at = time.monotonic() + every / 2
        k = 0
        with ThreadPoolExecutor(size, thread_name_prefix="burst") as pool:
            while not self.stop.wait(max(next_at - time.monotonic(), 0)):
                self.add("bursts")
                self.add("burst_requests", size)
                futures = [pool.submit(self.one, k * 7 + j, "burst", 24) for j in range(size)]
                wait(futures, timeout=120)  # `one` gives up after GIVE_UP_S
                k += 1
                next_at += every


class Service:
    """A serving process (a node or the conductor) logging to `workdir/<name>.log`; its
    address is the one on its line `... listening on HOST:PORT`. (Not
    tests/serving/helpers.py's NodeProcess: importing it loads torch into this process,
    +180 MiB of the driver's RSS.)"""

    def __init__(self, name: str, workdir: Path, *args: str) -> None:
        self.name, self.log = name, workdir / f"{name}.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT,
                env=child_env(),
            )  # fmt: skip
        self._address = ""

    @property
    def address(self) -> str:
        deadline = time.monotonic() + 2 * START_TIMEOUT_S
        while not self._address:
            text = self.log.read_bytes()
            for line in text.splitlines():
                if b" listening on " in line:
                    self._address = line.rsplit(b" ", 1)[1].strip().decode()
            if self._address:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not start: {text[-2000:].decode()}")
            time.sleep(0.1)
        return self._address

    def stop(self) -> None:
        stop_process(self.proc)


def start_serving(address: str, workdir: Path) -> dict[str, Service]:
    """Prefill and decode nodes and a conductor, each given the masters' HA list."""
    node = ("--listen", "127.0.0.1:0", "--torch-threads", "1", "--master", address,
            "--master-wait-s", "30")  # fmt: skip
    out = {
        "prefill": Service("prefill", workdir, "prefill_node", *node, "--node-id", "prefill"),
        "decode": Service("decode", workdir, "decode_node", *node, "--node-id", "decode",
                          "--num-blocks", str(DECODE_BLOCKS)),
    }  # fmt: skip
    try:
        prefill, decode = out["prefill"].address, out["decode"].address  # booting in parallel
        out["conductor"] = Service(
            "conductor", workdir, "kvstore.conductor", "--listen", "127.0.0.1:0",
            "--master", address, "--prefill", prefill, "--decode", decode,
        )  # fmt: skip
        assert out["conductor"].address
    except BaseException:
        for service in out.values():
            service.stop()
        raise
    return out


def processes(c: HACluster, etcd: Etcd, serving: dict[str, int]) -> dict[str, int]:
    import os

    out = {f"master{i}": p.pid for i, p in enumerate(c.master_procs) if p is not None}
    out.update({n.node_id.split("-")[0]: n.proc.pid for n in c.node_procs})
    if etcd.proc is not None:
        out["etcd"] = etcd.proc.pid
    out.update(serving)
    out["clients"] = os.getpid()
    return out


def dead(c: HACluster, serving: dict[str, Service]) -> list[str]:
    """The processes that exited on their own (a leader the soak killed is restarted)."""
    out = [f"master{i}" for i, p in enumerate(c.master_procs) if p is None or p.poll() is not None]
    out += [n.node_id for n in c.node_procs if n.proc.poll() is not None]
    return out + [name for name, s in serving.items() if s.proc.poll() is not None]


class Elections:
    """The `event=leader_elected` lines of the masters' logs (HACluster's
    `workdir/master{i}.log`) as they appear: which master took over since the last poll."""

    def __init__(self, workdir: Path, masters: int) -> None:
        self.paths = [workdir / f"master{i}.log" for i in range(masters)]
        self.offsets = [0] * masters

    def poll(self) -> list[int]:
        new: list[int] = []
        for i, path in enumerate(self.paths):
            try:
                with path.open("rb") as f:
                    f.seek(self.offsets[i])
                    chunk = f.read()
            except OSError:
                continue
            whole = chunk[: chunk.rfind(b"\n") + 1]  # complete lines only
            self.offsets[i] += len(whole)
            new += [i] * whole.count(b"event=leader_elected")
        return new


@dataclass
class Outcome:
    samples: dict[str, list[tuple[float, float]]]
    anon_samples: dict[str, list[tuple[float, float]]]
    kills: int
    elections: list[tuple[float, str]]  # (s, master) of each election after the start
    workers: list[Worker]
    check: dict[str, int]
    evictions: int
    serving: ServingLoad | None
    died: list[str]


def run(args: argparse.Namespace, seconds: float, workdir: Path) -> Outcome:
    """The soak itself: RSS samples by process, leader kills, workers, integrity, evictions."""
    samples: dict[str, list[tuple[float, float]]] = {}
    anon_samples: dict[str, list[tuple[float, float]]] = {}  # RssAnon: heap, not mmap
    kills = 0
    with Etcd(workdir / "etcd") as etcd, HACluster(
        etcd=etcd, masters=3, nodes=3, dram_bytes=16 << 20, workdir=workdir
    ) as c:  # fmt: skip
        procs = start_serving(c.address, workdir) if args.serving else {}
        try:
            pids = {name: proc.proc.pid for name, proc in procs.items()}
            # this process's start-up objects (grpc, the client library, the cluster's
            # bookkeeping) are frozen, so that its full collections, which free the
            # cycles its threads leave, walk only what the run allocates (as the
            # conductor does, kvstore/conductor/__main__.py)
            gc.collect()
            gc.freeze()
            stop = threading.Event()
            workers = [Worker(c.address, w, stop) for w in range(args.clients)]
            for w in workers:
                w.start()
            load = ServingLoad(procs["conductor"].address, stop, args) if procs else None
            if load is not None:
                load.start()
            elections, elected = Elections(workdir, 3), []
            elections.poll()  # the first leader's
            t0 = time.monotonic()
            next_kill = t0 + args.kill_leader_every if args.kill_leader_every else float("inf")
            while (now := time.monotonic()) - t0 < seconds:
                for name, pid in processes(c, etcd, pids).items():
                    mib = rss_mib(pid)
                    anon = rss_mib(pid, "RssAnon")
                    if mib is not None and anon is not None:
                        samples.setdefault(name, []).append((now - t0, mib))
                        anon_samples.setdefault(name, []).append((now - t0, anon))
                elected += [(now - t0, f"master{i}") for i in elections.poll()]
                if now >= next_kill:
                    i = c.wait_leader()
                    c.kill_master(i, signal.SIGKILL)
                    c.wait_leader(not_=i)
                    c.start_one_master(i)
                    kills += 1
                    next_kill = now + args.kill_leader_every
                    samples = {k: v for k, v in samples.items() if not k.startswith(f"master{i}")}
                    anon_samples = {k: v for k, v in anon_samples.items() if k in samples}
                time.sleep(args.sample_s)
            stop.set()
            for w in workers:
                w.join(60)
            if load is not None:
                load.join(150)
                load.close()
            died = dead(c, procs)
            check = integrity(c.address, workers)
            evictions = int(c.stats().evictions)
        finally:
            for proc in reversed(procs.values()):  # the conductor first
                proc.stop()
    return Outcome(samples, anon_samples, kills, elected, workers, check, evictions, load, died)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=1800)
    p.add_argument("--ci", action="store_true", help="a 5-minute run")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--sample-s", type=float, default=2.0)
    p.add_argument("--kill-leader-every", type=float, default=0.0, help="0 = never")
    serving_help = "prefill + decode nodes and a conductor on the pool, steady load and bursts"
    p.add_argument("--serving", action=argparse.BooleanOptionalAction, default=True,
                   help=serving_help)  # fmt: skip
    p.add_argument("--burst-every", type=float, default=30.0, help="seconds between bursts")
    p.add_argument("--burst-size", type=int, default=32, help="requests sent at once")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "soak.json"))
    p.add_argument("--keep-workdir", action="store_true", help="keep etcd's data and the logs")
    args = p.parse_args()
    if find_etcd() is None:
        print("bench/soak.py: no etcd binary (apt-get install etcd-server)", file=sys.stderr)
        return 4
    seconds = CI_SECONDS if args.ci else args.seconds
    workdir = Path(tempfile.mkdtemp(prefix="kvs-soak-"))
    try:
        o = run(args, seconds, workdir)
    finally:
        if args.keep_workdir:
            print(f"bench/soak.py: logs and etcd data kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    warm = warmup_s(seconds)
    slopes = {name: round(rss_slope_mib_per_min(pts, seconds), 3)
              for name, pts in o.samples.items()}  # fmt: skip
    anon_slopes = {name: round(rss_slope_mib_per_min(pts, seconds), 3)
                   for name, pts in o.anon_samples.items()}  # fmt: skip
    lsq_slopes = {  # the least-squares line through every sample after the warm-up: the
        # figure of the runs before 2026-12-02, for comparison (not the verdict)
        name: round(least_squares_mib_per_min([pt for pt in pts if pt[0] >= warm]), 3)
        for name, pts in o.samples.items()
    }
    # A master that took over after the warm-up loaded the whole index then (a step of
    # ~25 MiB: a takeover, not growth), read from etcd: their slopes are reported, not
    # judged. (Under a load of 10+, a leader can miss its 2-s lease and hand over
    # without a kill: once in the 9 runs of 2026-12-02.)
    not_judged = {name: f"took over at {t:.0f} s" for t, name in o.elections if t >= warm}
    if not_judged:
        not_judged["etcd"] = "served a takeover's index load"
    judged = {name: v for name, v in slopes.items() if name not in not_judged}
    workers, check = o.workers, o.check
    counts = {k: sum(w.counts[k] for w in workers) for k in workers[0].counts}
    seen_evicted = sum(w.seen_evicted for w in workers)
    untyped = [u for w in workers for u in w.untyped]
    serving: dict[str, object] = {"enabled": False}
    serving_ok = True
    if o.serving is not None:
        sc = o.serving.counts
        serving = {
            "enabled": True, "decode_kv_blocks": DECODE_BLOCKS,
            "burst_every_s": args.burst_every, "burst_size": args.burst_size, **sc,
            "error_types": sorted(o.serving.error_types),
            "untyped_errors": len(o.serving.untyped),
            "untyped_examples": o.serving.untyped[:5],
            "distinct_prompts_checked": len(o.serving.tokens),
        }  # fmt: skip
        serving_ok = (
            sc["requests_ok"] > 0 and sc["requests_failed"] == 0 and not o.serving.untyped
            and sc["rejections"] == sc["rejections_with_hint"] and sc["given_up"] == 0
            and sc["token_mismatches"] == 0
        )  # fmt: skip
    result = {
        "bench": "soak", "seconds": seconds, "clients": args.clients, "masters": 3,
        "nodes": 3, "leader_kills": o.kills, "ops": counts,
        "ops_per_s": round((counts["put"] + counts["get"]) / seconds),
        "error_types": sorted({t for w in workers for t in w.error_types}),
        "untyped_errors": len(untyped), "evictions": o.evictions, **check,
        "evicted_while_running": seen_evicted,
        "evictions_of_other_objects": o.evictions - check["evicted"] - seen_evicted,
        "serving": serving, "processes_died": o.died,
        "warmup_s": warm, "rss_slope_mib_per_min": slopes,
        "rss_anon_slope_mib_per_min": anon_slopes, "rss_lsq_slope_mib_per_min": lsq_slopes,
        "rss_last_mib": {k: round(v[-1][1], 1) for k, v in o.samples.items() if v},
        "target_slope_mib_per_min": 1.0,
        "leader_elections": [[round(t, 1), name] for t, name in o.elections],
        "rss_slope_not_judged": not_judged,
        "met": max(judged.values(), default=0.0) < 1.0 and check["integrity_failures"] == 0
        and not untyped and serving_ok and not o.died,
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    series = {  # the curves behind the slopes (the file only): [s, RSS MiB, RssAnon MiB]
        name: [[round(t, 1), round(v, 2), round(a, 2)] for (t, v), (_, a) in
               zip(pts, o.anon_samples.get(name, pts), strict=True)]
        for name, pts in o.samples.items()
    }  # fmt: skip
    Path(args.out).write_text(json.dumps({**result, "rss_samples": series}, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"soak {seconds:.0f} s, {args.clients} clients, 3 masters, 3 nodes, "
          f"{o.kills} leader kills")  # fmt: skip
    print(f"ops {counts} ({result['ops_per_s']}/s), errors {result['error_types'] or '-'}, "
          f"untyped {len(untyped)}")  # fmt: skip
    print(f"integrity: {check['verified']} verified, {check['evicted']} evicted, "
          f"{check['integrity_failures']} failures (master evictions {o.evictions}; "
          f"{result['evicted_while_running']} found evicted while running)")  # fmt: skip
    if o.serving is not None:
        print(f"serving: {o.serving.counts}, errors {serving['error_types'] or '-'}, "
              f"untyped {serving['untyped_errors']}")  # fmt: skip
    print(f"processes died: {o.died or '-'}")
    for name in sorted(slopes):
        print(f"  RSS {name:>9}: {result['rss_last_mib'][name]:8.1f} MiB, "
              f"slope {slopes[name]:+.3f} MiB/min after warm-up")  # fmt: skip
    for name, why in not_judged.items():
        print(f"  {name}'s slope not judged: {why}")
    print(
        "target slope < 1 MiB/min, 0 integrity failures, every rejection with a hint, "
        f"no process died: {'met' if result['met'] else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
