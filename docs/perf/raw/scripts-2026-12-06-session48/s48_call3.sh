#!/bin/bash
# Session 48, call 3: on an H200, issue 17's batch-256 engines first (bf16 against W8A8 + FP8 K/V, then W8A8
# at batch 1 against bf16), then the spike diagnosis with what time is left; on an H100 the diagnosis only.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$name"
if [[ "$name" == *H200* ]]; then
  python3 -c "from perf.roofline import measure; import json; print(json.dumps(measure()))" | tee $OUT/roofline.json
  timeout 290 python3 -m perf.bench_fp8 --out $OUT/fp8b256 --parts speed --repeats 1 --configs bf16 "w8a8 + KV" w8a8 --batches 1 256 2>&1 | tail -14
  timeout 100 python3 scratch/s48/s48_diag.py $OUT/diag.json 2>&1 | tail -40
else
  timeout 300 python3 scratch/s48/s48_diag.py $OUT/diag.json 2>&1 | tail -40
fi
