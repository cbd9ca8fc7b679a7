#!/bin/bash
# Session 50 call 1: on an H200, issue 17's FP8 engines against bf16 at batches 1 and 256 (two runs
# each); on any other card, the decode-attention benchmark's command line (never run on a GPU before).
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee $OUT/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
git log --oneline -1 | tee -a $OUT/gpu.txt
start=$(date +%s)
if grep -q H200 $OUT/gpu.txt; then
  mkdir -p $OUT/fp8
  timeout ${FP8_TIMEOUT:-545} python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --repeats 2 --configs bf16 "w8a8 + KV" w8a8 --batches 1 256 > $OUT/fp8/fp8.log 2>&1
  echo "rc=$? seconds=$(( $(date +%s) - start ))" | tee -a $OUT/gpu.txt
  tail -n 30 $OUT/fp8/fp8.log
else
  mkdir -p $OUT/da
  timeout ${DA_TIMEOUT:-240} python3 -m perf.bench_decode_attention --out $OUT/da --no-key-depth > $OUT/da/da.log 2>&1
  echo "rc=$? seconds=$(( $(date +%s) - start ))" | tee -a $OUT/gpu.txt
  tail -n 40 $OUT/da/da.log
fi
