"""The kvstore client: `Client` (sync) and `AsyncClient`, over the master and data plane.

Operations are written once (kvstore.client.ops, as generators of steps) and run by
either client. Contract: /work/helpers/CLIENT_API.md (kept in docs by the lead).
"""

from kvstore.client.aio import AsyncClient
from kvstore.client.client import Client
from kvstore.client.config import ClientConfig
from kvstore.client.ops import PrefixMatchResult
from kvstore.client.writes import PutOptions

__all__ = ["AsyncClient", "Client", "ClientConfig", "PrefixMatchResult", "PutOptions"]
