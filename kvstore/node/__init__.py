"""Storage node: lends DRAM/SSD segments to the pool and serves one-sided I/O into them."""

from kvstore.node.config import NodeConfig
from kvstore.node.node import StorageNode, run_node

__all__ = ["NodeConfig", "StorageNode", "run_node"]
