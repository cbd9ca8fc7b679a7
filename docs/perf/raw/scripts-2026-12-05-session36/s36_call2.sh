#!/usr/bin/env bash
# Session 36 call 2: W8A8 + FP8 K/V engines at batch 256 (and 64), the decode kernel as today and capped at 96 registers.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
for v in "0 0" "96 0" "0 0" "96 0"; do
  set -- $v
  t0=$(date +%s)
  timeout 250 python3 scratch/s36_engines.py $1 $2 --out $OUT/eng2_$1_$t0 --parts speed --configs "w8a8 + KV" --batches 256 --repeats 2 > $OUT/eng2_$1_$t0.log 2>&1
  echo "engine cap $1 rc $? $(( $(date +%s) - t0 )) s"; grep -E "^\|" $OUT/eng2_$1_$t0.log | tail -4
done
