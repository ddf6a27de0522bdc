"""Conductor errors: an early rejection is a RESOURCE_EXHAUSTED with a retry hint.

NoSpaceError (kvstore.errors, RESOURCE_EXHAUSTED)
└── RejectedError   predicted TTFT/TBT would miss the request's objective
"""

from __future__ import annotations

from kvstore.errors import NoSpaceError


class RejectedError(NoSpaceError):
    """The request was rejected early because it would miss its objective.

    `retry_after_s` is the predicted time until the cluster could meet the
    objective (queue drain), or None when no wait helps (the objective is below
    what even an idle cluster achieves for this request).
    """

    def __init__(self, message: str, retry_after_s: float | None) -> None:
        hint = "no retry helps" if retry_after_s is None else f"retry after {retry_after_s:.3f}s"
        super().__init__(f"{message}; {hint}")
        self.retry_after_s = retry_after_s
