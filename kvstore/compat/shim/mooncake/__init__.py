"""kvstore's stand-in for the `mooncake` package: `mooncake.store` is kvstore's facade.

Not on sys.path by default (it must never shadow Mooncake's real wheel): put its
parent directory first on PYTHONPATH to run unmodified Mooncake Store clients
(vLLM's MooncakeStoreConnector, SGLang's and LMCache's Mooncake backends) on kvstore:

    export PYTHONPATH=$(python -m kvstore.compat.shim)${PYTHONPATH:+:$PYTHONPATH}
"""

from typing import Any

KVSTORE_SHIM = True

__all__ = ["BufferPool", "RegisteredBufferPool"]  # as Mooncake's own mooncake/__init__.py


def __getattr__(name: str) -> Any:
    """`mooncake.BufferPool` / `mooncake.RegisteredBufferPool` (Mooncake exports both at the
    top level): the facade's pool, imported on first use so that `import mooncake` stays
    light (kvstore's client loads only with `mooncake.store`)."""
    if name in __all__:
        from mooncake import buffer_pool

        return getattr(buffer_pool, name)
    raise AttributeError(f"module 'mooncake' has no attribute {name!r}")
