#!/usr/bin/env bash
# Prepared in session 44 for the next GPU session (main; s44_knobs.py and this script in scratch/, [".whl", "scratch"] carried):
#   bash scratch/s44_next_call.sh engines   bf16, W8A8 + FP8 K/V and W8A8 at batches 1 and 256: issue 17's ratios (about 450 s cold)
#   bash scratch/s44_next_call.sh pdl       W8A8 + FP8 K/V at batch 256: dependent launches up to 4 programs an SM, and for
#                                           every launch, against main's one-wave rule, alternating (about 420 s cold)
#   bash scratch/s44_next_call.sh osplit    W8A8's o split in 4 K ranges at decode (gemm.WAVE_SPLIT_MIN_STEPS=2; W8A8 bits
#                                           change): its row-class GPU tests, then W8A8 at batches 1 and 256 against main
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/n
t0=$(date +%s)
run() {  # TAG TIMEOUT CONFIG BATCHES [KNOBS...]
  local tag=$1 limit=$2 config=$3 batches=$4; shift 4
  timeout $limit python3 scratch/s44_knobs.py "$@" -- perf.bench_fp8 --out $OUT/n/$tag --parts speed --repeats 2 \
    --configs "$config" --batches $batches > $OUT/n/$tag.log 2>&1
  echo "== $tag $* rc=$? t=$(( $(date +%s) - t0 ))s"; grep -E "^\| (w8a8|bf16)" $OUT/n/$tag.log
}
if [ "${1:-engines}" = engines ]; then
  run kv 200 "w8a8 + KV" "1 256"
  run bf16 200 bf16 "1 256"   # its GEMMs compile cold (130 s was too little in session 44)
  run w8a8 $(( 585 - ($(date +%s) - t0) )) w8a8 "1 256"
elif [ "$1" = mix ]; then
  run kv 120 "w8a8 + KV" "1 256"
  run bf16 200 bf16 "1 256"
  run pdl4 70 "w8a8 + KV" "256" pdl_sms=4
  run pdl_all 70 "w8a8 + KV" "256" pdl_sms=0
  run kv_again 50 "w8a8 + KV" "256"
  run pdl4_again $(( 585 - ($(date +%s) - t0) )) "w8a8 + KV" "256" pdl_sms=4
elif [ "$1" = pdlall ]; then
  run kv_b1 60 "w8a8 + KV" "1" pdl_sms=0
  run w8a8 60 w8a8 "1 256" pdl_sms=0
  run bf16 80 bf16 "1 256" pdl_sms=0
  timeout $(( 400 - ($(date +%s) - t0) )) python3 scratch/s44_knobs.py pdl_sms=0 -- pytest -m gpu -q -p no:cacheprovider -rfE \
    --tb=short tests/runtime/test_engine_gpu.py > $OUT/n/pdlall-tests.log 2>&1
  echo "== pdlall tests rc=$?"; tail -n 5 $OUT/n/pdlall-tests.log
elif [ "$1" = osplit ]; then
  timeout 150 python3 scratch/s44_knobs.py gemm.WAVE_SPLIT_MIN_STEPS=2 -- pytest -m gpu -q -p no:cacheprovider -rfE \
    --tb=short tests/kernels/test_w8a8.py tests/kernels/test_linear_norm.py > $OUT/n/osplit-tests.log 2>&1
  echo "== osplit tests rc=$?"; tail -n 3 $OUT/n/osplit-tests.log
  run main 200 w8a8 "1 256"
  run osplit 90 w8a8 "1 256" gemm.WAVE_SPLIT_MIN_STEPS=2
  run main_again 80 w8a8 "1 256"
  run osplit_again $(( 585 - ($(date +%s) - t0) )) w8a8 "1 256" gemm.WAVE_SPLIT_MIN_STEPS=2
else
  run main 200 "w8a8 + KV" "256"
  run pdl4 80 "w8a8 + KV" "256" pdl_sms=4
  run pdl_all 80 "w8a8 + KV" "256" pdl_sms=0
  run main_again 70 "w8a8 + KV" "256"
  run pdl4_again 70 "w8a8 + KV" "256" pdl_sms=4
  run pdl_all_again $(( 585 - ($(date +%s) - t0) )) "w8a8 + KV" "256" pdl_sms=0
fi
cd $OUT && tar czf n.tgz n && rm -rf n
