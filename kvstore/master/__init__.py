"""The master: metadata service of the pool (objects -> replicas, leases, eviction).

`metadata.MasterState` is the pure core (no grpc, injectable clock);
`service`/`server` expose it over gRPC (contract: proto/kvstore/v1/master.proto).
"""
