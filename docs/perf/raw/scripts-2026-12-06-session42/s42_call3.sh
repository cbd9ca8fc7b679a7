#!/usr/bin/env bash
# Session 42 call 3: the FP8 engines against bf16 at batches 1, 64 and 256 (two runs each).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/fp8
timeout ${FP8_TIMEOUT:-540} python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --repeats 2 --configs bf16 "w8a8 + KV" w8a8 > $OUT/fp8/fp8.log 2>&1
tail -n 40 $OUT/fp8/fp8.log
