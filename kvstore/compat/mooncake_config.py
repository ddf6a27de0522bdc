"""Mooncake Store's write configuration and setup argument forms.

`ReplicateConfig` and `SoftPinAction` mirror `mooncake.store` (0.3.13): callers set
fields one by one, `soft_pin_ttl_ms` is None by default and only a u64 (or None),
and `str(config)` names every field. `parse_size` takes the size forms Mooncake's
`setup(dict)` accepts ("16MB", "16 MB", 16777216) and refuses percentages.
"""

from __future__ import annotations

import re
from enum import IntEnum
from typing import Any

from kvstore.errors import BadRequestError

U64_MAX = (1 << 64) - 1
MAX_PIN_S = 3600.0  # the master's longest pin
DEFAULT_SOFT_PIN_MS = 30 * 60 * 1000  # Mooncake master's default soft-pin TTL


class SoftPinAction(IntEnum):
    """What a write does to the soft pin: keep it, start one, or drop it."""

    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ObjectDataType(IntEnum):
    """Mooncake's object data-type tag (accepted, not interpreted)."""

    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class ReplicateConfig:
    """Mooncake's ReplicateConfig. The facade honours `replica_num`, the pins and
    `group_ids` (kvstore groups); placement hints are accepted and ignored."""

    def __init__(self, **fields: Any) -> None:
        self.replica_num: int = 1
        self.nof_replica_num: int = 0
        self.dfs_replica_num: int = 0
        self.soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE
        self._soft_pin_ttl_ms: int | None = None
        self.with_hard_pin: bool = False
        self.preferred_segment: str = ""
        self.preferred_segments: list[str] = []
        self.preferred_nof_segments: list[str] = []
        self.prefer_alloc_in_same_node: bool = False
        self.group_ids: list[str] | None = None
        self.data_type: ObjectDataType = ObjectDataType.UNKNOWN
        for name, value in fields.items():  # a convenience Mooncake's class lacks
            if not hasattr(self, name):
                raise TypeError(f"ReplicateConfig has no field {name!r}")
            setattr(self, name, value)

    @property
    def soft_pin_ttl_ms(self) -> int | None:
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, value: int | None) -> None:
        # pybind's Optional<uint64_t>: a negative or too-large int is a TypeError
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= U64_MAX
        ):
            raise TypeError(f"soft_pin_ttl_ms must be None or an int in [0, 2**64), got {value!r}")
        self._soft_pin_ttl_ms = value

    def __str__(self) -> str:
        ttl = "default" if self._soft_pin_ttl_ms is None else str(self._soft_pin_ttl_ms)
        action = SoftPinAction(int(self.soft_pin_action)).name
        return (
            f"ReplicateConfig: {{ replica_num: {self.replica_num}, nof_replica_num: "
            f"{self.nof_replica_num}, dfs_replica_num: {self.dfs_replica_num}, "
            f"soft_pin_action: {action}, soft_pin_ttl_ms: {ttl}, with_hard_pin: "
            f"{int(self.with_hard_pin)}, preferred_segments: {self.preferred_segments}, "
            f"prefer_alloc_in_same_node: {int(self.prefer_alloc_in_same_node)} }}"
        )

    __repr__ = __str__


def put_options(config: object | None, n_keys: int = 1) -> list[dict[str, Any]]:
    """Client put options per key from a (Mooncake or facade) ReplicateConfig.

    BadRequestError (-> INVALID_PARAMS) for what Mooncake's master rejects: a TTL
    without `SoftPinAction.ENABLE`, a replica count < 1, group_ids of the wrong length.
    Works on Mooncake's own class too (attributes read with getattr).
    """
    if config is None:
        return [{} for _ in range(n_keys)]
    replicas = int(getattr(config, "replica_num", 1))
    if replicas < 1:
        raise BadRequestError(f"replica_num must be >= 1, got {replicas}")
    kw: dict[str, Any] = {"replicas": replicas}
    ttl_ms = getattr(config, "soft_pin_ttl_ms", None)
    action = int(getattr(config, "soft_pin_action", SoftPinAction.PRESERVE))
    if getattr(config, "with_soft_pin", False):  # the pre-0.3.13 boolean form
        action = int(SoftPinAction.ENABLE)
    if ttl_ms is not None and action != SoftPinAction.ENABLE:
        raise BadRequestError("soft_pin_ttl_ms is valid only with SoftPinAction.ENABLE")
    if getattr(config, "with_hard_pin", False):
        kw["pin_ttl_s"] = MAX_PIN_S
    elif action == SoftPinAction.ENABLE and ttl_ms != 0:
        kw["pin_ttl_s"] = min((ttl_ms or DEFAULT_SOFT_PIN_MS) / 1000, MAX_PIN_S)
    groups = getattr(config, "group_ids", None)
    if groups is None:
        return [dict(kw) for _ in range(n_keys)]
    if len(groups) != n_keys:
        raise BadRequestError(f"{len(groups)} group_ids for {n_keys} keys")
    return [dict(kw, group=str(g)) for g in groups]


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|tb|k|m|g|t|kib|mib|gib|tib)?\s*$", re.I)
_UNIT = {"": 0, "b": 0, "k": 10, "kb": 10, "kib": 10, "m": 20, "mb": 20, "mib": 20,
         "g": 30, "gb": 30, "gib": 30, "t": 40, "tb": 40, "tib": 40}  # fmt: skip


def parse_size(value: object, what: str = "size") -> int:
    """Bytes from an int or a string such as "16MB" / "16 MB" / "1.5 GiB" (units are
    powers of 1024, as Mooncake's); BadRequestError for anything else ("50%", -1)."""
    if isinstance(value, bool):
        raise BadRequestError(f"{what} must be a size, got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        size = int(float(m.group(1)) * (1 << _UNIT[(m.group(2) or "").lower()]))
    else:
        raise BadRequestError(f"{what} {value!r} is not a size (bytes or e.g. '16MB')")
    if size < 0:
        raise BadRequestError(f"{what} must be >= 0, got {value!r}")
    return size
