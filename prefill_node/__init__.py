"""Prefill node: a gRPC PrefillService over `kvstore.serving.prefill.PrefillWorker`."""
