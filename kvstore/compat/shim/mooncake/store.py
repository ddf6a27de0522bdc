"""`mooncake.store` served by kvstore: everything kvstore.compat.mooncake exports."""

from kvstore.compat.mooncake import *  # noqa: F403
from kvstore.compat.mooncake import __all__  # noqa: F401
