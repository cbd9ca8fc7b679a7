# Session 21, call 3: the engines with FP8 K/V read as words, two tiles in flight; then the conformance matrix.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 270 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --configs bf16 "w8a8 + KV" "fp8 weights + KV" > $OUT/fp8_speed.log 2>&1; echo "fp8 rc=$?" >> $OUT/fp8_speed.log
grep -E "^\{|^roofline|rc=" $OUT/fp8_speed.log | cut -c1-400
timeout 290 python3 -m perf.conformance --out $OUT/conf --cases 72 --seed 0 --workers 10 --budget-s 270 > $OUT/conformance.log 2>&1
grep -E "^ *(fail|crash|timeout|not-run) " -A2 $OUT/conformance.log | head -30; grep "^conformance:" $OUT/conformance.log; rm -rf $OUT/conf/cases
