"""Machines and their price: per-node cost and power of the hardware the profiles ran on.

`kvstore/data/hardware.csv` (sources in kvstore/data/README.md: Splitwise's cost table,
splitwise-sim's machine power): one row per machine type (`sku`) with its GPU type
(`hardware`, as in profile names), GPU count, cost per hour and power. A `NodeKind` is one
serving instance: a profile on `gpus` GPUs of one sku; its cost and power are its share of
the machine's. grpc- and torch-free (the simulator and the bench use it).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kvstore.conductor.profiles import Profile, data_dir, load_profile, profile_name
from kvstore.errors import BadRequestError, NotFoundError

HARDWARE_CSV = "hardware.csv"


@dataclass(frozen=True, slots=True)
class Machine:
    """One machine type: its GPUs and what an hour of it costs, in dollars and watts."""

    sku: str
    hardware: str
    gpus: int
    cost_per_hour: float
    power_w: float

    def __post_init__(self) -> None:
        if self.gpus <= 0 or self.cost_per_hour <= 0 or self.power_w <= 0:
            raise BadRequestError(f"machine {self.sku}: gpus, cost and power must be > 0")


@dataclass(frozen=True, slots=True)
class NodeKind:
    """A serving instance: `profile` (model, hardware, TP) on a share of one machine."""

    profile: Profile
    machine: Machine

    @property
    def gpus(self) -> int:
        return self.profile.tensor_parallel

    @property
    def cost_per_hour(self) -> float:
        return self.machine.cost_per_hour * self.gpus / self.machine.gpus

    @property
    def power_w(self) -> float:
        return self.machine.power_w * self.gpus / self.machine.gpus


@cache
def machines(directory: Path | None = None) -> dict[str, Machine]:
    """Every machine type of the data, by sku."""
    path = (directory if directory is not None else data_dir()) / HARDWARE_CSV
    if not path.is_file():
        raise NotFoundError(f"hardware data {path} is missing (set KVSTORE_DATA_DIR)")
    with path.open(newline="") as f:
        rows = [
            Machine(
                r["sku"], r["hardware"], int(r["gpus"]), float(r["cost_per_hour_usd"]),
                float(r["power_w"]),
            )
            for r in csv.DictReader(f)
        ]  # fmt: skip
    return {m.sku: m for m in rows}


def machine_for(hardware: str, directory: Path | None = None) -> Machine:
    """The machine type of a GPU type ("a100", "h100", "h100pcap"); NotFoundError listing
    the types the data has."""
    found = [m for m in machines(directory).values() if m.hardware == hardware]
    if not found:
        have = sorted(m.hardware for m in machines(directory).values())
        raise NotFoundError(f"no machine with hardware {hardware!r}; available: {have}")
    return found[0]


def node_kind(
    model: str, hardware: str, tensor_parallel: int, directory: Path | None = None
) -> NodeKind:
    """`model` on `tensor_parallel` GPUs of `hardware`; NotFoundError (listing what exists)
    when the data has no profile or no machine for it."""
    name = profile_name(model, hardware, tensor_parallel)
    machine = machine_for(hardware, directory)
    if tensor_parallel > machine.gpus:
        raise BadRequestError(
            f"TP{tensor_parallel} does not fit a {machine.gpus}-GPU {machine.sku}"
        )
    return NodeKind(load_profile(name, directory), machine)
