#!/usr/bin/env bash
# Prepared in session 43 for the next GPU session (the FP8 decode kernel now runs 2 warps; its bits changed):
#   OUT=... bash perf/run_gpu.sh tests        the GPU suite beside the matrix (first: trust)
#   bash scratch/s43_next_call.sh engines     bf16, W8A8 + FP8 K/V and W8A8 at batches 1, 64, 256 (issue 17's ratios)
#   bash scratch/s43_next_call.sh ab          W8A8 + FP8 K/V at batches 1 and 256 under four settings against main:
#       dependent launches up to 4 programs an SM; every launch dependent; RoPE + K/V write fused into every
#       decode launch; four FP8 key tiles in flight (batch 1 only: small launches)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/n
if [ "${1:-engines}" = engines ]; then
  timeout ${FP8_TIMEOUT:-540} python3 -m perf.bench_fp8 --out $OUT/n/fp8 --parts speed --repeats 2 \
    --configs bf16 "w8a8 + KV" w8a8 > $OUT/n/fp8.log 2>&1
  tail -n 30 $OUT/n/fp8.log
else
  run() {  # TAG TIMEOUT BATCHES KNOBS...
    local tag=$1 limit=$2 batches=$3; shift 3
    timeout $limit python3 scratch/s43_knobs.py "$@" -- --out $OUT/n/$tag --parts speed --repeats 2 \
      --configs "w8a8 + KV" --batches $batches > $OUT/n/$tag.log 2>&1
    echo "== $tag $*"; grep -E "^\| w8a8" $OUT/n/$tag.log
  }
  run main 200 "1 256"
  run pdl4 100 "1 256" pdl_sms=4
  run pdl_all 100 "1 256" pdl_sms=0
  run rope_fused 100 "1 256" attention.FUSED_ROPE_BELOW_PROGRAMS_PER_SM=1000000
  run main_again 100 "1 256"
  run tiles4 60 "1" attention.DECODE_TILES_FP8=4
fi
cd $OUT && tar czf n.tgz n && rm -rf n
