#!/usr/bin/env bash
# One prepared run for the GPU machine (the device tool), for a session that is lent one:
#   run(command="bash bench/gpu_check.sh", timeout_s=480)
# It runs the gpu-marked tests (HBM pool and tier on cuda, the engine on cuda, a storage
# node lending a cuda HBM segment to the pool) and the
# HBM offload/onload bench, whose target is >= 0.9x one pinned bulk copy (issue 2), and
# leaves the outputs under $OUT. The device image has torch, grpcio, xxhash and pytest;
# rocksdict is not needed by these tests.
set -uo pipefail
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L 2>&1 | tee "$out/gpu.txt"
python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/tiers/test_hbm.py tests/tiers/test_hbm_pool.py tests/model/test_gpu.py \
  tests/node/test_pool_tiers.py 2>&1 \
  | tee "$out/gpu_tests.txt"
python3 bench/hbm_offload.py --json >"$out/hbm_offload.json"
python3 bench/hbm_offload.py 2>&1 | tee "$out/hbm_offload.txt"
