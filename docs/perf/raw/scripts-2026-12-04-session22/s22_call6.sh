# Session 22, call 6: the 18 matrix cases call 5's budget left out; adaptive speculation at every batch.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 200 python3 -m perf.conformance --out $OUT/conf --cases 72 --seed 0 --workers 12 --budget-s 185 --only 'c062 ' --only 'c063 ' --only 'c064 ' --only 'c066 ' --only 'c067 ' --only 'c068 ' --only 'c069 ' --only 'c070 ' --only 'c071 ' --only 'c061 ' --only 'c058 ' --only 'c035 ' --only 'c055 ' --only 'c052 ' --only 'c043 ' --only 'c060 ' --only 'c049 ' --only 'c059 '  > $OUT/conformance.log 2>&1
grep -E "^ *(fail|crash|timeout|not-run) " -A2 $OUT/conformance.log | head -30; grep "^conformance:" $OUT/conformance.log; rm -rf $OUT/conf/cases
RLT_SPEC_BATCHES=1,16,64,256 RLT_SPEC_CONFIGS=adaptive RLT_SPEC_ACCEPTANCE=measured,0.9 timeout 260 python3 -m perf.bench_speculative --out $OUT/spec > $OUT/spec.log 2>&1
echo "spec rc=$?"; grep -E "^\| " $OUT/spec.log | tail -4
