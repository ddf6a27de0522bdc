"""`kvstore store-demo`: the tiered-store workload really runs and reports per-tier figures."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from cli.store_demo import DemoConfig, run_store_demo


def test_store_demo_hits_the_shared_prefixes(tmp_path: Path) -> None:
    report = run_store_demo(
        DemoConfig(conversations=4, turns=3, dram_mib=4, ssd_mib=64), str(tmp_path)
    )
    # 4 conversations x 3 turns of 192, 384 and 576 tokens = 12 + 24 + 36 blocks per conversation
    lookups, hits = map(int, re.search(r"looked up: (\d+), prefix hits: (\d+)", report).groups())
    assert lookups == 4 * (12 + 24 + 36)
    assert hits == 4 * (12 + 24)  # each turn finds the whole previous prompt cached
    assert re.search(r"^DRAM\s+4\.0\s", report, re.M)
    assert re.search(r"^SSD\s+64\.0\s", report, re.M)
    assert "demotions" in report


def test_store_demo_command_line() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "cli.main", "store-demo", "--conversations", "2", "--turns", "2"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "prefix hits: 24 (33.3%)" in run.stdout
