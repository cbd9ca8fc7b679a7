#!/usr/bin/env bash
# Prepared in session 42 for the next GPU session, two calls of about 400 s each:
#   bash scratch/s42_next_call.sh warps   the decode attention with 2 warps against 4 (kernels over FP8 and
#                                         bf16 caches, then the W8A8 + FP8 K/V engine at batches 64 and 256, bf16 at 256)
#   bash scratch/s42_next_call.sh pdl     dependent launches for launches of up to 4 programs an SM, or every
#                                         launch (the W8A8 + FP8 K/V engine at 1, 64, 256; bf16 at 256)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/w
engine() {  # WARPS CAP PDL_SMS CONFIG BATCHES...
  local w=$1 c=$2 p=$3 cfg=$4 name="e$1-$2-$3-${4// /}"; shift 4
  timeout 120 python3 scratch/s42_patched_bench.py $w $c $p --out $OUT/w/$name --parts speed --repeats 2 \
    --configs "$cfg" --batches "$@" > $OUT/w/$name.log 2>&1
  echo "== warps $w cap $c pdl_sms $p"; grep -E "^\| (w8a8|bf16)" $OUT/w/$name.log
}
if [ "${1:-warps}" = warps ]; then
  timeout 200 python3 scratch/s42_decode_warps.py $OUT/w/kernels.json 2>&1 | tee $OUT/w/kernels.log | tail -n 60
  engine 4 96 1 "w8a8 + KV" 64 256
  engine 2 120 1 "w8a8 + KV" 64 256
  engine 2 0 1 "w8a8 + KV" 64 256
  engine 4 96 1 bf16 256
  engine 2 0 1 bf16 256
else
  engine 4 96 1 "w8a8 + KV" 1 64 256
  engine 4 96 4 "w8a8 + KV" 1 64 256
  engine 4 96 0 "w8a8 + KV" 1 64 256
  engine 4 96 1 bf16 256
  engine 4 96 4 bf16 256
fi
