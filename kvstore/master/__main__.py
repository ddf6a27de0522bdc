"""`python -m kvstore.master --listen HOST:PORT [--db PATH] [...]`: run one master
(flags in `kvstore.master.launch`)."""

from __future__ import annotations

import sys

from kvstore.master.launch import main

if __name__ == "__main__":
    sys.exit(main())
