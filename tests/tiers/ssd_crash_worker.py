"""Subprocess for the SSD kill -9 test: writes and removes objects until killed.

Usage: python ssd_crash_worker.py DIRECTORY CAPACITY_BYTES

Each object's bytes derive from its key (`payload`), so the parent can check
them after a restart. A line "C <key>" is printed (and flushed) only after
commit returned, "R <key>" only after remove returned. At most LIVE objects
are kept, so the slab's space is freed and reused while the parent watches.
"""

from __future__ import annotations

import random
import sys

from kvstore.tiers.ssd import SsdConfig, SsdTier
from kvstore.types import ObjectKey

LIVE = 5
MAX_OBJECTS = 100_000


def payload(key: str) -> bytes:
    """The bytes stored under `key`: 1 B .. 2 MiB, pseudo-random, seeded by the key."""
    rng = random.Random(key)
    size = rng.choice([1, 4095, 4096, 65_537, 1 << 20, (2 << 20) - 3])
    return rng.randbytes(size)


def main(directory: str, capacity: int) -> None:
    tier = SsdTier(SsdConfig(directory, capacity))
    live: list[ObjectKey] = []
    for i in range(MAX_OBJECTS):
        key = ObjectKey(f"obj-{i}")
        tier.put(key, payload(key))
        print(f"C {key}", flush=True)
        live.append(key)
        if len(live) > LIVE:
            old = live.pop(0)
            tier.remove(old)
            print(f"R {old}", flush=True)
    tier.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
