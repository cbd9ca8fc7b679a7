#!/usr/bin/env bash
# Session 40 call 1: the GPU suite beside the 72-case matrix on main (heads-first decode grid).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
t0=$(date +%s)
WORK=/tmp/w1 PART_TIMEOUT=470 WORKERS=6 CONF_CASES=72 CONF_WORKERS=8 CONF_BUDGET=430 CONF_TIMEOUT=470 bash perf/run_gpu.sh tests
echo "tests rc $? $(( $(date +%s) - t0 )) s"
cp /tmp/w1/conformance.log /tmp/w1/gpu_tests.log /tmp/w1/gpu_tests_summary.txt $OUT/ 2>/dev/null
ls /tmp/w1/conformance | head -3
