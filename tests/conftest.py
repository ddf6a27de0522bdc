"""Shared fixtures and marker handling for the kvstore test suite."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _can_netns() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True)
    return probe.returncode == 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = None if _has_cuda() else pytest.mark.skip(reason="no CUDA device here")
    skip_netns = None if _can_netns() else pytest.mark.skip(reason="needs root and ip netns")
    for item in items:
        if skip_gpu and item.get_closest_marker("gpu"):
            item.add_marker(skip_gpu)
        if skip_netns and item.get_closest_marker("netns"):
            item.add_marker(skip_netns)
