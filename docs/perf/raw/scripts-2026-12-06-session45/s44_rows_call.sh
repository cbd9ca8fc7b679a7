#!/usr/bin/env bash
# Prepared in session 44 for branch fp8-attention-rows (check it out; main's tree travels in scratch/main_tree,
# made by: rm -rf scratch/main_tree && mkdir scratch/main_tree && git archive main rlt_kernels rlt_runtime perf | tar -x -C scratch/main_tree;
# carry [".whl", "scratch"] with this script and s44_knobs.py in scratch/).
#   bash scratch/s44_rows_call.sh tests     the rows' GPU tests and the W8A8 GPU tests beside the W8A8 matrix cases (about 300 s)
#   bash scratch/s44_rows_call.sh engines   W8A8 + FP8 K/V and W8A8 at batches 1 and 256, main and branch alternating, then W8A8
#                                           at batch 1 with the rows in unsplit launches only (about 590 s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/r
main_tree=$PWD/scratch/main_tree
if [ "${1:-tests}" = tests ]; then
  PYTHONPATH=/tmp/site:. timeout -s INT -k 20 280 python3 -m pytest -m gpu -n 3 -p no:cacheprovider -rfE --tb=short \
    tests/kernels/test_attention_fp8_rows.py tests/kernels/test_rope_paged_attention.py tests/kernels/test_w8a8.py \
    tests/runtime/test_engine_gpu.py > $OUT/r/gpu_tests.log 2>&1 &
  only=()
  for c in c020 c024 c029 c043 c005 c008 c011 c023 c059; do only+=(--only "$c "); done
  PYTHONPATH=/tmp/site:. timeout 290 python3 -m perf.conformance --out $OUT/r/conformance --cases 72 --seed 0 --workers 3 \
    --budget-s 270 "${only[@]}" > $OUT/r/conformance.log 2>&1
  grep "^conformance:" $OUT/r/conformance.log; grep -E -A1 "^ *(fail|crash|timeout) " $OUT/r/conformance.log | head -20
  wait
  grep -E "^(FAILED|ERROR)|^=+ .*(passed|failed|error).* =+$" $OUT/r/gpu_tests.log
else
  run() {  # TAG TREE TIMEOUT CONFIG
    PYTHONPATH=/tmp/site:$2 timeout $3 python3 -m perf.bench_fp8 --out $OUT/r/$1 --parts speed --repeats 2 \
      --configs "$4" --batches 1 256 > $OUT/r/$1.log 2>&1
    echo "== $1"; grep -E "^\| (w8a8|bf16)" $OUT/r/$1.log
  }
  run kv-main $main_tree 200 "w8a8 + KV"
  run kv-branch . 110 "w8a8 + KV"
  run w8a8-main $main_tree 100 w8a8
  run w8a8-branch . 80 w8a8
  run kv-main-again $main_tree 80 "w8a8 + KV"
  run kv-branch-again . 80 "w8a8 + KV"
  # batch 1 with the rows left to quantize_rows in split launches (s44_knobs.py in scratch/)
  PYTHONPATH=/tmp/site:. timeout 60 python3 scratch/s44_knobs.py attention.FP8_ROWS_IN_SPLIT_LAUNCHES=0 -- perf.bench_fp8 \
    --out $OUT/r/w8a8-branch-unsplit-rows --parts speed --repeats 2 --configs w8a8 --batches 1 > $OUT/r/w8a8-branch-unsplit-rows.log 2>&1
  echo "== w8a8-branch-unsplit-rows"; grep -E "^\| w8a8" $OUT/r/w8a8-branch-unsplit-rows.log
fi
cd $OUT && tar czf r.tgz r && rm -rf r
