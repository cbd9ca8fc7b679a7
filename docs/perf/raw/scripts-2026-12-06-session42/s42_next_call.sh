#!/usr/bin/env bash
# Prepared in session 42 for the next GPU session: the FP8 decode attention with 2 warps against 4, alone and in the W8A8 + FP8 K/V engine.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/w
timeout 200 python3 scratch/s42_decode_warps.py $OUT/w/kernels.json 2>&1 | tee $OUT/w/kernels.log | tail -n 40
for v in "4 96" "2 128" "2 0"; do
  set -- $v
  timeout 150 python3 scratch/s42_patched_bench.py $1 $2 --out $OUT/w/e$1-$2 --parts speed --repeats 2 \
    --configs "w8a8 + KV" --batches 1 64 256 > $OUT/w/e$1-$2.log 2>&1
  echo "== warps $1 cap $2"; grep -E "^\| w8a8" $OUT/w/e$1-$2.log
done
