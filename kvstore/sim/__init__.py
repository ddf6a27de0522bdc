"""kvstore.sim: a trace-driven cluster simulator that runs the conductor's real policies.

    traces   Mooncake (.jsonl) and Azure (.csv) readers, synthetic generators, rate scaling
    cache    block LRU, DRAM+SSD tiered LRU, one-global-LRU replay (the hit-ratio bound)
    pool     per-node local caches vs one pooled store with global LRU; both a PrefixIndex
    events   heap-based discrete-event loop (ties in schedule order)
    cluster  nodes with prefill queues, continuous-batching decode, KV moves, KV memory
    replay   `simulate` (full event simulation) and `route_only` (fast hit-ratio path)
    metrics  TTFT/TBT percentiles, SLO attainment, DistServe goodput

Step times come from the conductor's fitted `LatencyModel`; load and move times from its
`TransferModel`. Nothing here imports grpc or torch.
"""
