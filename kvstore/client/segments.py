"""A segment a client contributes to the pool, as in Mooncake: the client process
becomes a storage node named by its client id (a shared-memory DRAM segment served
over TCP and by fd to same-host peers, registered and heart-beating), and its puts
prefer that node. With an SSD segment beside the DRAM one, the master offloads cold
objects to it and promotes them back on reads, on this node (as for a `kvstore node`)."""

from __future__ import annotations

from kvstore.client.config import ClientConfig
from kvstore.node.config import NodeConfig
from kvstore.node.node import StorageNode


def contributed_node(config: ClientConfig) -> StorageNode:
    """The (not yet started) node lending `config.segment_bytes` of DRAM (and
    `config.hbm_segment_bytes` of device memory, `config.ssd_bytes` of SSD in
    `config.ssd_dir`) for this client. Like every StorageNode it runs the master's tier
    moves (offload, promotion: kvstore.node.tasks) and says so at registration."""
    return StorageNode(
        NodeConfig(
            master=config.master,
            masters=config.masters,  # HA: the lent segment follows the leader too
            node_id=config.id,
            listen_host=config.listen_host,
            dram_bytes=config.segment_bytes,
            hbm_bytes=config.hbm_segment_bytes,
            hbm_device=config.hbm_device,
            ssd_dir=config.ssd_dir,
            ssd_bytes=config.ssd_bytes,
            rpc_timeout_s=config.timeout_s,
            credentials=config.credentials,
            # its data plane's TLS and capability checks follow the client's credential
            ca_file=config.ca_file,
            cert_file=config.cert_file,
            key_file=config.key_file,
            token_file=config.token_file,
        )
    )
