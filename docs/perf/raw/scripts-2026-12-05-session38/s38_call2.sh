#!/usr/bin/env bash
# Session 38 call 2 (warm machine): per-step host and device time of the W8A8 + FP8 K/V engine at
# batch 256 (perf.step_gaps), then the FP8 engines' speed.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
timeout -s INT 200 python3 -m perf.step_gaps --out $OUT/gaps --batch 256 --quantization w8a8_fp8 --kv-cache-dtype fp8 > $OUT/gaps.log 2>&1
echo "gaps rc $? $(( $(date +%s) - t0 )) s"; grep -v "Warning\|warn" $OUT/gaps.log | cut -c1-300 | head -60
t0=$(date +%s)
timeout -s INT 340 python3 -m perf.bench_fp8 --out $OUT/eng --parts speed --configs "w8a8 + KV" w8a8 --batches 1 64 256 --repeats 2 > $OUT/eng.log 2>&1
echo "engines rc $? $(( $(date +%s) - t0 )) s"; grep -E "^\{|^\||roofline" $OUT/eng.log | cut -c1-300 | tail -14
