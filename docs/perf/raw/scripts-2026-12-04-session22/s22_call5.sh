# Session 22, call 5: the 72-case conformance matrix (failures rerun alone), then speculation at batches 16 and 64.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 300 python3 -m perf.conformance --out $OUT/conf --cases 72 --seed 0 --workers 10 --budget-s 280 > $OUT/conformance.log 2>&1
grep -E "^ *(fail|crash|timeout|not-run) " -A2 $OUT/conformance.log | head -30; grep "^conformance:" $OUT/conformance.log; rm -rf $OUT/conf/cases
RLT_SPEC_BATCHES=16,64 RLT_SPEC_CONFIGS=fixed4,adaptive RLT_SPEC_ACCEPTANCE=0.9 timeout 230 python3 -m perf.bench_speculative --out $OUT/spec > $OUT/spec.log 2>&1
echo "spec rc=$?"; grep -E "^\| " $OUT/spec.log | tail -4
