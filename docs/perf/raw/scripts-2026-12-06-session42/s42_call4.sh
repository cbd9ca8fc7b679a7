#!/usr/bin/env bash
# Session 42 call 4: self-speculative decoding after the verify change (adaptive @ 0.9, batches 1, 16, 64).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
RLT_SPEC_CONFIGS=adaptive RLT_SPEC_ACCEPTANCE=0.9 RLT_SPEC_BATCHES=${SPEC_BATCHES:-1,16,64} \
  PART_TIMEOUT=${PART_TIMEOUT:-300} bash perf/run_gpu.sh spec
