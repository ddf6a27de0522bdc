"""The interference benchmark's runs: both serving modes side by side, phases
interleaved, records per mode and phase.

    colocated       two colocated nodes, one core each; requests round-robin
    disaggregated   a prefill node on one core, a decode node on the other; the
                    master and a storage node unpinned (they mostly idle)

All six serving processes start at once and stay up; only one mode is driven at a
time (an idle node sleeps on a condition), and the modes alternate phase by phase
(stream, burst; order flipped each round), so a shared host's load, which drifts
by the minute, weighs on both modes alike; the light phase alternates in short
blocks of a few requests. Phases: `stream` (the
decode-heavy stream alone: the no-burst baseline), `burst` (the same stream plus
bursts of long prompts), `light` (short prompts at light load), and finally on the
disaggregated cluster `long` (very long prompts alone: KV handoff vs prefill).

The schedules are written for a nominal speed (`reference_prefill_s` for a
`reference_prompt`-token prefill). The warm-up times that prefill on every node and
stretches (or, on a faster machine, compresses) the schedules by the slow-down
(clamped to [min_slowdown, max_slowdown]), so the
load relative to the machine stays what the spec means.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvstore.errors import BadRequestError, UnavailableError
from kvstore.serving_bench.hostload import ForeignLoad, ProcessLoad, cpus_allowed
from kvstore.serving_bench.launch import Launcher, serving_argv, storage_argv
from kvstore.serving_bench.loadgen import ColocatedTarget, DisaggTarget, Target, drive
from kvstore.serving_bench.metrics import RequestRecord
from kvstore.serving_bench.workload import Arrival, MixSpec, mixed_schedule, random_prompt

Progress = Callable[[str], None]
MODES = ("colocated", "disaggregated")


@dataclass(frozen=True, slots=True)
class BenchSizes:
    """Model, load phases and probe sizes of one benchmark run."""

    model: str
    heavy: MixSpec  # the stream with bursts; `heavy.without_bursts()` is the baseline
    light: MixSpec
    long_prompt: int  # tokens of the KV-handoff probe prompts
    long_count: int
    reference_prompt: int = 256
    reference_prefill_s: float = 0.5
    light_parts: int = 4
    min_slowdown: float = 0.5
    max_slowdown: float = 3.0
    storage_mib: int = 512
    block_tokens: int = 16
    idle_probe_s: float = 1.5  # each process's CPU use measured over this, all idle

    def __post_init__(self) -> None:
        if self.heavy.burst_every_s <= 0:
            raise BadRequestError("the heavy phase needs bursts (burst_every_s > 0)")
        if self.long_prompt < 1 or self.long_count < 0 or self.storage_mib < 1:
            raise BadRequestError("bad long-prompt probe or storage size")
        if self.reference_prompt < 1 or self.reference_prefill_s <= 0:
            raise BadRequestError("bad reference prompt")
        if self.idle_probe_s <= 0:
            raise BadRequestError("idle_probe_s must be positive")
        if not 0 < self.min_slowdown <= 1 <= self.max_slowdown or self.light_parts < 1:
            raise BadRequestError("need 0 < min_slowdown <= 1 <= max_slowdown, light_parts >= 1")

    def phases(
        self, slowdown: float, round_index: int = 0, rounds: int = 1
    ) -> dict[str, list[Arrival]]:
        """Round `round_index` of `rounds`: each phase slowed, 1/rounds of its duration,
        fresh prompts (a repeated prompt would hit the pool's prefix cache)."""
        if not 0 <= round_index < rounds:
            raise BadRequestError(f"round {round_index} not in [0, {rounds})")

        def part(spec: MixSpec) -> MixSpec:
            slowed = spec.slowed(slowdown)
            seed = spec.seed + 1000 * round_index
            return replace(slowed, duration_s=slowed.duration_s / rounds, seed=seed)

        heavy = part(self.heavy)
        return {
            "stream": mixed_schedule(heavy.without_bursts()),
            "burst": mixed_schedule(heavy),
        }

    def light_blocks(self, slowdown: float, blocks: int) -> list[list[Arrival]]:
        """The light phase cut into `blocks` schedules (fresh prompts each)."""
        light = self.light.slowed(slowdown)
        light = replace(light, duration_s=light.duration_s / blocks)
        return [mixed_schedule(replace(light, seed=light.seed + 1000 * b)) for b in range(blocks)]

    def long_probe(self) -> list[Arrival]:
        rng = random.Random(self.heavy.seed + 7)
        n, vocab = self.long_prompt, self.heavy.vocab
        return [
            Arrival(0.0, f"long{i}", "long", random_prompt(rng, n, vocab), 2)
            for i in range(self.long_count)
        ]

    def warmup(self, nodes: int, seed: int) -> list[Arrival]:
        """One reference-size request per node: wakes every node, times its prefill."""
        rng = random.Random(12345 + seed)
        n, vocab = self.reference_prompt, self.heavy.vocab
        return [
            Arrival(0.0, f"warm{i}", "warmup", random_prompt(rng, n, vocab), 4)
            for i in range(nodes)
        ]


@dataclass(slots=True)
class ModeRun:
    """What one serving mode produced: records per phase (rounds pooled)."""

    mode: str
    records: dict[str, list[RequestRecord]] = field(default_factory=dict)
    foreign_cores: dict[str, list[float]] = field(default_factory=dict)  # per phase run

    def add(self, phase: str, records: list[RequestRecord], foreign_cores: float = 0.0) -> None:
        self.records.setdefault(phase, []).extend(records)
        self.foreign_cores.setdefault(phase, []).append(foreign_cores)


@dataclass(slots=True)
class BenchRun:
    slowdown: float  # applied to the schedules
    measured_slowdown: dict[str, float]  # per mode, from the warm-up
    runs: dict[str, ModeRun]
    idle_cores: dict[str, float] = field(default_factory=dict)  # per process, all idle
    cpus_allowed: dict[str, str] = field(default_factory=dict)  # per process, from /proc


@dataclass(frozen=True, slots=True)
class Clusters:
    colocated: tuple[str, ...]
    prefill: str
    decode: str
    pinned: dict[str, str]  # process name -> the cores it was asked to run on


def two_cores() -> tuple[int, int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise BadRequestError(f"the interference bench needs 2 cores, this process has {cpus}")
    return cpus[0], cpus[1]


def start_clusters(sizes: BenchSizes, launcher: Launcher) -> Clusters:
    """Master first (the others need its address), then five processes in parallel."""
    cores = two_cores()
    model, bt = sizes.model, ["--block-tokens", str(sizes.block_tokens)]
    master = launcher.master()
    store_id = f"bench{os.getpid()}-store"
    colocated = [
        (f"colocated{i}", serving_argv("decode_node", model=model, cpus=(c,),
                                       extra=["--colocated", *bt]))
        for i, c in enumerate(cores)
    ]  # fmt: skip
    addresses = launcher.start_many(
        [
            *colocated,
            (store_id, storage_argv(master, sizes.storage_mib, store_id)),
            ("prefill", serving_argv("prefill_node", model=model, cpus=(cores[0],),
                                     master=master, extra=bt)),
            ("decode", serving_argv("decode_node", model=model, cpus=(cores[1],),
                                    master=master, extra=bt)),
        ]
    )  # fmt: skip
    pinned = {"colocated0": str(cores[0]), "colocated1": str(cores[1]),
              "prefill": str(cores[0]), "decode": str(cores[1])}  # fmt: skip
    return Clusters(tuple(addresses[:2]), addresses[3], addresses[4], pinned)


def check_pinning(clusters: Clusters, pids: dict[str, int]) -> dict[str, str]:
    """Every process's allowed cores as /proc reports them; a serving node that is not
    on the core it was given makes the comparison meaningless, so that raises."""
    allowed = {name: cpus_allowed(pid) for name, pid in pids.items()}
    wrong = {n: allowed.get(n) for n, want in clusters.pinned.items() if allowed.get(n) != want}
    if wrong:
        raise UnavailableError(f"nodes not pinned as asked {clusters.pinned}: {wrong}")
    return allowed


def _reference_s(records: list[RequestRecord]) -> float:
    times = [r.compute_s for r in records if r.ok and r.compute_s > 0]
    if not times:
        raise BadRequestError(f"warm-up failed: {[r.error for r in records]}")
    return statistics.median(times)


async def _idle_load(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Each process's CPU use while nothing is sent: an idle node should use ~0."""
    load = ProcessLoad(pids)
    load.start()
    await asyncio.sleep(seconds)  # the measurement window itself, not a wait for an event
    return load.stop()


async def _bench(
    sizes: BenchSizes,
    clusters: Clusters,
    slowdown: float | None,
    rounds: int,
    progress: Progress,
    pids: dict[str, int],
) -> BenchRun:
    meter = ForeignLoad(lambda: [os.getpid(), *pids.values()])

    async def metered(target: Target, arrivals: list[Arrival]) -> tuple[list[RequestRecord], float]:
        meter.start()
        records = await drive(arrivals, target)
        return records, meter.stop()

    targets: dict[str, Target] = {
        "colocated": ColocatedTarget(clusters.colocated, sizes.model),
        "disaggregated": DisaggTarget(clusters.prefill, clusters.decode, sizes.model),
    }
    try:
        measured = {}
        for mode, target in targets.items():
            progress(f"warm-up {mode}")
            nodes = 2 if mode == "colocated" else 1
            await drive(sizes.warmup(nodes, 0), target)  # first steps are slow (lazy init)
            # one at a time: two prefills at once on the 2 cores slow each other 1.3-3x
            timed = [await target.run(a) for a in sizes.warmup(nodes, 1)]
            reference = _reference_s(timed)
            measured[mode] = reference / sizes.reference_prefill_s
        typical = statistics.median(measured.values())
        factor = slowdown or min(max(typical, sizes.min_slowdown), sizes.max_slowdown)
        run = BenchRun(factor, measured, {m: ModeRun(m) for m in MODES})
        run.cpus_allowed = check_pinning(clusters, pids)
        run.idle_cores = await _idle_load(pids, sizes.idle_probe_s)
        progress(f"idle CPU per process (cores): {run.idle_cores}")
        for r in range(rounds):
            for name, arrivals in sizes.phases(factor, r, rounds).items():
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    progress(f"round {r + 1}/{rounds} {mode} {name}")
                    run.runs[mode].add(name, *await metered(targets[mode], arrivals))
        progress(f"light load, {sizes.light_parts} alternating blocks per mode")
        for b, arrivals in enumerate(sizes.light_blocks(factor, sizes.light_parts)):
            for mode in MODES if b % 2 == 0 else MODES[::-1]:
                run.runs[mode].add("light", *await metered(targets[mode], arrivals))
        if sizes.long_count:
            progress("disaggregated long-prompt KV handoff probe")
            probe = await metered(targets["disaggregated"], sizes.long_probe())
            run.runs["disaggregated"].add("long", *probe)
        return run
    finally:
        await asyncio.gather(*(t.close() for t in targets.values()))


def run_bench(
    sizes: BenchSizes,
    launcher: Launcher,
    slowdown: float | None = None,
    rounds: int = 1,
    progress: Progress = lambda _: None,
) -> BenchRun:
    """Start both clusters, warm them up, run the interleaved phases."""
    progress("starting 2 colocated nodes, master, storage, prefill and decode nodes")
    clusters = start_clusters(sizes, launcher)
    pids = launcher.named_pids()
    return asyncio.run(_bench(sizes, clusters, slowdown, rounds, progress, pids))
