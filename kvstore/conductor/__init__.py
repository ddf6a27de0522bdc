"""kvstore.conductor: placement policies, admission, replication advice and pool planning.

Free of grpc and torch; the gRPC service and the simulator run this same code.
See `api.py` for the interface.
"""

from kvstore.conductor.api import (
    ClusterView,
    Decision,
    NodeState,
    Policy,
    PrefixIndex,
    PrefixMatch,
    Request,
    Role,
)
from kvstore.conductor.errors import RejectedError
from kvstore.conductor.registry import POLICIES, make_policy

__all__ = [
    "POLICIES",
    "ClusterView",
    "Decision",
    "NodeState",
    "Policy",
    "PrefixIndex",
    "PrefixMatch",
    "RejectedError",
    "Request",
    "Role",
    "make_policy",
]
