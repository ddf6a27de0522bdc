"""Per-request choice between remote prefill and local prefill on the decode node.

Local prefill saves the prefill queue and the KV move, but a decode node that
prefills stops decoding meanwhile: if it spends a share `s` of its time on
prefills, its streams' mean time between tokens stretches from `step` to
`step / (1 - s)`. `PrefillShare` tracks `s` per node (exponentially decayed over
`window_s`, so each prefill of `d` seconds adds `d / window_s` and the steady
state is the busy fraction), and local prefill is allowed only while the
stretched step stays within a share `tbt_fill` of the TBT objective.
"""

from __future__ import annotations

import math


class PrefillShare:
    """Decayed share of time each node spends on local prefills (deterministic, by request time)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._state: dict[str, tuple[float, float]] = {}  # node -> (share, at time)

    def share(self, node_id: str, now: float) -> float:
        """The node's prefill share at `now` (0 for a node never used)."""
        share, at = self._state.get(node_id, (0.0, now))
        return share * math.exp(-max(now - at, 0.0) / self.window_s)

    def add(self, node_id: str, now: float, seconds: float) -> None:
        """Record a local prefill of `seconds` started on `node_id` at `now`."""
        self._state[node_id] = (self.share(node_id, now) + seconds / self.window_s, now)


def stretched_tbt_s(step_s: float, share: float) -> float:
    """Mean time between tokens when a share `share` of the node's time goes to prefill."""
    return math.inf if share >= 1 else step_s / (1 - share)
