#!/usr/bin/env bash
# Session 39 call 1: decode programs of several rows: kernel timings and bits, the decode GPU tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
timeout -s INT 300 python3 scratch/s39_rows.py $OUT/rows_kernels.json kernels > $OUT/rows_kernels.log 2>&1
echo "kernels rc $? $(( $(date +%s) - t0 )) s"; grep -v "Warn\|warn" $OUT/rows_kernels.log | cut -c1-900
t0=$(date +%s)
timeout -s INT 150 python3 -m pytest tests/kernels/test_attention.py tests/kernels/test_fp8_kv.py tests/kernels/test_rope_paged_attention.py -m gpu -q -p no:cacheprovider -n 4 > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc $? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|ERROR" $OUT/gpu_tests.log | tail -8
