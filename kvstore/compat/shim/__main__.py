"""`python -m kvstore.compat.shim` prints the directory to put on PYTHONPATH."""

from pathlib import Path

print(Path(__file__).resolve().parent)
