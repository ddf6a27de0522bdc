"""kvstore.serving: what prefill and decode nodes share (grpc-free unless noted).

config      ServingConfig (model, KV pool, batching mode, policies), ProcessConfig
request     Request (validated generation), Handoff (where the prompt's KV lives)
store       BlockStore protocol; PoolBlockStore (pool client), LocalBlockStore (tiers)
kv_io       pool <-> store objects: per (block, layer) or per block
publisher   KVPublisher: background writes that overlap compute
prefill     PrefillWorker: match prefix, load hits, chunked prefill, publish
tails       TailSweeper: removes handed-off tails not consumed within a TTL
prefill_queue  PrefillQueue: the prefill node's queue counts (Stats)
jobs        DecodeJob state machine and its events
scheduler   DecodeScheduler: admission by free blocks, pulls, continuous batching
convert     protobuf <-> dataclasses
node        node processes: command line, store, gRPC server (grpc)
client      ServingClient for tests, benches and demos (grpc)
"""
