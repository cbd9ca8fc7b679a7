#!/usr/bin/env bash
# Session 37 call 1: decode attention A/B (main vs this tree), the attention GPU tests, then the
# W8A8 + FP8 K/V engines (this tree, main) at batch 256 and 1.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
t0=$(date +%s)
PYTHONPATH=/tmp/site:scratch/old:scratch:. timeout 180 python3 scratch/s37_decode_ab.py $OUT/s37_decode_ab.json > $OUT/s37_decode_ab.log 2>&1
echo "ab rc $? $(( $(date +%s) - t0 )) s"; cut -c1-250 $OUT/s37_decode_ab.log | grep -v Warning
t0=$(date +%s)
timeout 120 python3 -m pytest tests/kernels/test_attention.py tests/kernels/test_fp8_kv.py tests/kernels/test_rope_paged_attention.py -m gpu -q -p no:cacheprovider -n 4 > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc $? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|ERROR" $OUT/gpu_tests.log | tail -8
for who in new main; do
  t0=$(date +%s)
  if [ $who = new ]; then dir=.; else dir=scratch/main_src; fi
  (cd $dir && PYTHONPATH=/tmp/site:. timeout 125 python3 -m perf.bench_fp8 --out $OUT/eng_$who --parts speed --configs "w8a8 + KV" --batches 256 1 --repeats 2 > $OUT/eng_$who.log 2>&1)
  echo "engine $who rc $? $(( $(date +%s) - t0 )) s"; grep -E "^\| w8a8" $OUT/eng_$who.log | tail -4
done
