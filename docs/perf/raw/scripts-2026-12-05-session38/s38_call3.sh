#!/usr/bin/env bash
# Session 38 call 3: W8A8 down adding its K ranges in the tile at middle rows: kernel A/B, the
# engines at batch 256 (and RoPE fused into every FP8 decode launch), the touched GPU tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
timeout -s INT 150 python3 scratch/s38_ab.py $OUT/ab_kernels.json kernels > $OUT/ab_kernels.log 2>&1
echo "kernels rc $? $(( $(date +%s) - t0 )) s"; grep -v "Warn\|warn" $OUT/ab_kernels.log | cut -c1-600
t0=$(date +%s)
timeout -s INT 330 python3 scratch/s38_ab.py $OUT/ab_engines.json engines > $OUT/ab_engines.log 2>&1
echo "engines rc $? $(( $(date +%s) - t0 )) s"; grep -v "Warn\|warn" $OUT/ab_engines.log | grep "^{\|H" | cut -c1-300
t0=$(date +%s)
timeout -s INT 80 python3 -m pytest tests/kernels/test_w8a8.py tests/kernels/test_linear_norm.py -m gpu -q -p no:cacheprovider -n 4 > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc $? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|ERROR" $OUT/gpu_tests.log | tail -8
