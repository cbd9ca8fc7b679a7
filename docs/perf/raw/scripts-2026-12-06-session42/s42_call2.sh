#!/usr/bin/env bash
# Session 42 call 2: the kernel tests with the `device` fixture (no gpu marker) on the GPU.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
PART_TIMEOUT=${PART_TIMEOUT:-270} WORKERS=8 bash perf/run_gpu.sh device-tests
