#!/bin/bash
# Session 51 call 1: the two-stream half-batch spike on any Hopper card; on an H200, then issue 17's
# FP8 engines against bf16 at batches 256 and 1.
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee $OUT/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
start=$(date +%s)
timeout ${TBO_TIMEOUT:-150} python3 scratch/s51/tbo_spike.py $OUT/tbo.json > $OUT/tbo.log 2>&1
echo "tbo rc=$? seconds=$(( $(date +%s) - start ))" | tee -a $OUT/gpu.txt
tail -n 25 $OUT/tbo.log
if grep -q H200 $OUT/gpu.txt; then
  mkdir -p $OUT/fp8
  timeout ${FP8_TIMEOUT:-400} python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --repeats ${REPEATS:-1} --configs bf16 "w8a8 + KV" w8a8 --batches 256 1 > $OUT/fp8/fp8.log 2>&1
  echo "fp8 rc=$? seconds=$(( $(date +%s) - start ))" | tee -a $OUT/gpu.txt
  tail -n 30 $OUT/fp8/fp8.log
else
  timeout ${CHAIN_TIMEOUT:-150} python3 -m perf.bench_decode_chain --out $OUT/chain --batches 1,64 > $OUT/chain.log 2>&1
  echo "chain rc=$? seconds=$(( $(date +%s) - start ))" | tee -a $OUT/gpu.txt
  tail -n 15 $OUT/chain.log
fi
