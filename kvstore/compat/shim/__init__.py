"""The directory holding kvstore's `mooncake` shim package (see mooncake/__init__.py).

Importing `kvstore.compat.shim` does not put the shim on sys.path; `SHIM_DIR` names
the directory to prepend to PYTHONPATH (`python -m kvstore.compat.shim` prints it).
"""

from pathlib import Path

SHIM_DIR = Path(__file__).resolve().parent
