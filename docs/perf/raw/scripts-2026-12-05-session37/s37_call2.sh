#!/usr/bin/env bash
# Session 37 call 2: the GPU suite and the conformance matrix side by side on this tree.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
PART_TIMEOUT=${PART_TIMEOUT:-450} WORKERS=6 CONF_CASES=72 CONF_WORKERS=8 CONF_BUDGET=${CONF_BUDGET:-410} CONF_TIMEOUT=${CONF_TIMEOUT:-460} OUT=$OUT WORK=$OUT/work bash perf/run_gpu.sh tests
grep -c PASSED $OUT/work/gpu_tests.log; grep -E "^(FAILED|ERROR)" $OUT/work/gpu_tests.log | head -20
