#!/bin/bash
# Session 48, call 4 (the budget's last minutes): on an H200 issue 17's batch-256 engines (bf16, W8A8 + FP8 K/V);
# on an H100 the spike's diagnosis (barrier alone, phases skipped, check at 1-4 layer-loops).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$name"
if [[ "$name" == *H200* ]]; then
  timeout 200 python3 -m perf.bench_fp8 --out $OUT/fp8b256 --parts speed --repeats 1 --configs bf16 "w8a8 + KV" --batches 256 2>&1 | tail -8
else
  timeout 150 python3 scratch/s48/s48_diag.py $OUT/diag.json 2>&1 | tail -40
fi
