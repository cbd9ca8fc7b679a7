#!/usr/bin/env bash
# Session 38 call 1: the engines on this tree (bf16, W8A8 + FP8 K/V, W8A8), then where their steps go.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
t0=$(date +%s)
timeout -s INT 370 python3 -m perf.bench_fp8 --out $OUT/eng --parts speed --configs bf16 "w8a8 + KV" w8a8 --batches 1 64 256 --repeats 2 > $OUT/eng.log 2>&1
echo "engines rc $? $(( $(date +%s) - t0 )) s"; grep -E "^\||copy|GB/s" $OUT/eng.log | tail -14
t0=$(date +%s)
timeout -s INT 200 python3 scratch/s38_breakdown.py $OUT/breakdown.json "w8a8 + KV" bf16 > $OUT/breakdown.log 2>&1
echo "breakdown rc $? $(( $(date +%s) - t0 )) s"; grep -v Warning $OUT/breakdown.log | cut -c1-160 | tail -80
