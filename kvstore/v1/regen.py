"""Regenerate the committed stubs from proto/kvstore/v1/*.proto, or check they are fresh.

    python -m kvstore.v1.regen          # rewrite kvstore/v1/*_pb2*.py(i)
    python -m kvstore.v1.regen --check  # exit 1 (and list files) when they are stale

`--check` generates into a temporary directory and compares byte for byte, so it
never touches the work tree.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
PROTO_DIR = PROTO_ROOT / "kvstore" / "v1"
STUB_DIR = REPO / "kvstore" / "v1"
STUB_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Run protoc on every .proto into `out_root`; return the stub paths written.

    protoc runs in a child process: its C++ protobuf runtime must not be loaded
    into a process that already holds the upb runtime (that segfaults)."""
    protos = sorted(str(p.relative_to(REPO)) for p in PROTO_DIR.glob("*.proto"))
    args = [
        sys.executable,
        "-c",
        _PROTOC_MAIN,
        f"-I{PROTO_ROOT.relative_to(REPO)}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *protos,
    ]
    # protoc resolves paths relative to the cwd: run from the repo root.
    run = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"protoc failed with exit code {run.returncode}: {run.stderr}")
    return sorted(_stubs(out_root / "kvstore" / "v1"))


# grpc_tools is a dev dependency, imported only when regenerating; its bundled
# well-known protos (google/protobuf/*.proto) are added to the include path.
_PROTOC_MAIN = """
import sys
from pathlib import Path
from grpc_tools import protoc
include = str(Path(protoc.__file__).parent / "_proto")
sys.exit(protoc.main(["protoc", f"-I{include}", *sys.argv[1:]]))
"""


def stale_files(stub_dir: Path = STUB_DIR) -> list[str]:
    """Names of stubs that differ from a fresh generation, are missing, or are extra."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh_dir = Path(tmp) / "kvstore" / "v1"
        fresh = {p.name for p in generate(Path(tmp))}
        have = {p.name for p in _stubs(stub_dir)}
        diff = sorted(fresh ^ have)
        for name in sorted(fresh & have):
            if not filecmp.cmp(fresh_dir / name, stub_dir / name, shallow=False):
                diff.append(name)
    return sorted(diff)


def regenerate(stub_dir: Path = STUB_DIR) -> list[str]:
    """Replace the committed stubs with a fresh generation; return the file names."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        for old in _stubs(stub_dir):
            old.unlink()
        for path in fresh:
            shutil.copyfile(path, stub_dir / path.name)
    return [p.name for p in fresh]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the stubs are stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: kvstore/v1/{name}", file=sys.stderr)
        if stale:
            print("run: python -m kvstore.v1.regen", file=sys.stderr)
        return 1 if stale else 0
    for name in regenerate():
        print(f"wrote kvstore/v1/{name}")
    return 0


def _stubs(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.endswith(STUB_SUFFIXES)]


if __name__ == "__main__":
    sys.exit(main())
