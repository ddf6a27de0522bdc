"""kvstore's stand-in for the `mooncake` package: `mooncake.store` is kvstore's facade.

Not on sys.path by default (it must never shadow Mooncake's real wheel): put its
parent directory first on PYTHONPATH to run unmodified Mooncake Store clients
(vLLM's MooncakeStoreConnector, SGLang's and LMCache's Mooncake backends) on kvstore:

    export PYTHONPATH=$(python -m kvstore.compat.shim)${PYTHONPATH:+:$PYTHONPATH}
"""

KVSTORE_SHIM = True
