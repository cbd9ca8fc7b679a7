#!/bin/bash
# Session 49: on an H200 only, issue 17's batch-256 engines (bf16 against W8A8 + FP8 K/V).
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
grep -q H200 $OUT/gpu.txt || { echo "not an H200: nothing run"; exit 0; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
git log --oneline -1 | tee -a $OUT/gpu.txt
timeout 280 python3 -m perf.bench_fp8 --out $OUT/f --parts speed --repeats 1 --configs bf16 "w8a8 + KV" --batches 256 > $OUT/bench.log 2>&1
tail -20 $OUT/bench.log
