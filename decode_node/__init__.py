"""Decode node: a gRPC DecodeService over `kvstore.serving.scheduler.DecodeScheduler`."""
