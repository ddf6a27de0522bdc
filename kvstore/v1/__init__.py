"""Generated gRPC/protobuf stubs of the kvstore.v1 contracts (see proto/kvstore/v1).

Do not edit the *_pb2*.py files: change the .proto and run `python -m kvstore.v1.regen`.
"""
