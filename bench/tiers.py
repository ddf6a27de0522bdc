"""Benchmark: the three tiers, each as a ratio against its physical baseline.

Runs, in one process and one sitting:
  - bench/dram_tier.py: DRAM tier put/get_into vs memcpy of the same bytes;
  - bench/ssd_tier.py: SSD tier put/get_into vs raw O_DIRECT I/O of the same bytes;
  - bench/hbm_offload.py: HBM offload/onload of scattered blocks vs one bulk copy
    (on cuda when present; on cpu here the figure shows the code path, not a link).
Object sizes 64 KiB, 1 MiB and 16 MiB. Targets: DRAM and SSD >= 0.7x their
baseline for objects >= 1 MiB; HBM >= 0.9x one pinned bulk copy (GPU machine).

    python bench/tiers.py [--quick] [--json] [--ssd-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dram_tier  # sibling bench modules, found through the sys.path line above
import hbm_offload
import ssd_tier

SIZES_MIB = "0.0625,1,16"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short run of every part")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--ssd-dir", default=None, help="directory on the disk under test")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, object]:
    common = ["--sizes-mib", SIZES_MIB] + (["--quick"] if args.quick else [])
    ssd_args = common + (["--dir", args.ssd_dir] if args.ssd_dir else [])
    hbm_args = ["--quick"] if args.quick else []
    return {
        "bench": "tiers",
        "dram": dram_tier.run(dram_tier.parse_args(common)),
        "ssd": ssd_tier.run(ssd_tier.parse_args(ssd_args)),
        "hbm": hbm_offload.run(hbm_offload.parse_args(hbm_args)),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result))
        return
    dram_tier.print_table(result["dram"])  # type: ignore[arg-type]
    print()
    ssd_tier.print_table(result["ssd"])  # type: ignore[arg-type]
    print()
    hbm_offload.print_table(result["hbm"])  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
