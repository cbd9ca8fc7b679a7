#!/usr/bin/env bash
# Session 43: the W8A8 + FP8 K/V engine, decode attention 4 warps cap 96 (main) against 2 warps cap 128, alternating.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/e
run() {  # TAG WARPS CAP TIMEOUT
  timeout $4 python3 scratch/s42_patched_bench.py $2 $3 1 --out $OUT/e/$1 --parts speed --repeats 2 \
    --configs "w8a8 + KV" --batches 1 256 > $OUT/e/$1.log 2>&1
  echo "== $1 warps $2 cap $3"; grep -E "^\| w8a8" $OUT/e/$1.log
}
run a1 4 96 260
run b1 2 128 150
run a2 4 96 110
run b2 2 128 110
