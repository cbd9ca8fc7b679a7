#!/bin/bash
# Session 50, a short budget: on an H200 only, issue 17's batch-256 engines (bf16 against W8A8 + FP8 K/V).
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
grep -q H200 $OUT/gpu.txt || { echo "not an H200: nothing run"; exit 0; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
git log --oneline -1 | tee -a $OUT/gpu.txt
mkdir -p $OUT/fp8; start=$(date +%s)
timeout ${FP8_TIMEOUT:-400} python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --repeats ${REPEATS:-2} --configs bf16 "w8a8 + KV" --batches 256 > $OUT/fp8/fp8.log 2>&1
echo "rc=$? seconds=$(( $(date +%s) - start ))" | tee -a $OUT/gpu.txt
tail -n 20 $OUT/fp8/fp8.log
