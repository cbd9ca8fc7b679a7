#!/usr/bin/env bash
# Session 44, call 1: RoPE + K/V write fused into every FP8 decode launch (2 warps, cap 128) against main's
# rule, W8A8 + FP8 K/V at batch 256, alternating; then bf16 and W8A8 for issue 17's ratios in the same call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/c1
t0=$(date +%s)
run() {  # TAG TIMEOUT CONFIG BATCHES [KNOBS...]
  local tag=$1 limit=$2 config=$3 batches=$4; shift 4
  timeout $limit python3 scratch/s43_knobs.py "$@" -- --out $OUT/c1/$tag --parts speed --repeats 2 \
    --configs "$config" --batches $batches > $OUT/c1/$tag.log 2>&1
  echo "== $tag $* rc=$? t=$(( $(date +%s) - t0 ))s"; grep -E "^\| (w8a8|bf16)" $OUT/c1/$tag.log
}
run kv_main 200 "w8a8 + KV" "256"
run kv_rope 90 "w8a8 + KV" "256" attention.FUSED_ROPE_BELOW_PROGRAMS_PER_SM=1000000
run kv_main2 80 "w8a8 + KV" "256"
run kv_rope2 80 "w8a8 + KV" "256" attention.FUSED_ROPE_BELOW_PROGRAMS_PER_SM=1000000
run bf16 130 bf16 "1 256"
run w8a8 $(( 585 - ($(date +%s) - t0) )) w8a8 "1"
cd $OUT && tar czf c1.tgz c1 && rm -rf c1
