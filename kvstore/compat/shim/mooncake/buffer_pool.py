"""`mooncake.buffer_pool`: the facade's BufferPool under both of Mooncake's names."""

from kvstore.compat.mooncake_pool import BufferPool

RegisteredBufferPool = BufferPool

__all__ = ["BufferPool", "RegisteredBufferPool"]
