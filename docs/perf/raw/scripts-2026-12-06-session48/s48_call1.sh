#!/bin/bash
# Session 48, call 1: the persistent batch-1 layer-loop spike, configurations one process each, then
# the engines' batch-1 steps (bf16, W8A8) in the same lease.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee $OUT/gpu.txt
python3 -c "from perf.roofline import measure; import json; print(json.dumps(measure()))" | tee $OUT/roofline.json
for cfg in "1 2 4" "0 2 4" "2 2 4" "1 3 4" "1 3 8"; do
  set -- $cfg
  echo "=== ahead $1 stages $2 warps $3"
  timeout 110 python3 scratch/s48/s48_gpu.py $1 $2 $3 $OUT/spike_a$1_s$2_w$3.json 2>&1 | tail -5
done
python3 -c "from perf.roofline import measure; import json; print(json.dumps(measure()))" | tee $OUT/roofline2.json
timeout 240 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --repeats 1 --configs bf16 w8a8 --batches 1 2>&1 | tail -15
