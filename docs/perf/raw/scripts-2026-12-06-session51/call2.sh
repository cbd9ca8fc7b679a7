#!/bin/bash
# Session 51 call 2: on an H200, issue 17's FP8 engines against bf16 at batches 256 and 1 (one run
# each, each engine capturing only those batches' graphs; REPEATS=2 for two; BATCHES=256 for batch 256 alone; W8A8= leaves W8A8 alone out); on any other card, nothing (the two-stream spike ran in call 1).
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee $OUT/gpu.txt
grep -q H200 $OUT/gpu.txt || exit 0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
start=$(date +%s)
mkdir -p $OUT/fp8
timeout ${FP8_TIMEOUT:-500} python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --repeats ${REPEATS:-1} --configs bf16 "w8a8 + KV" ${W8A8-w8a8} --batches ${BATCHES:-256 1} --graph-sizes ${BATCHES:-256 1} > $OUT/fp8/fp8.log 2>&1
echo "fp8 rc=$? seconds=$(( $(date +%s) - start ))" | tee -a $OUT/gpu.txt
tail -n 30 $OUT/fp8/fp8.log
