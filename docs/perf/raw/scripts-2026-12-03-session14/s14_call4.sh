python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p $OUT/work
timeout 155 python3 -m perf.conformance --out $OUT/work/conformance --cases 72 --seed 0 --workers 8 --budget-s 145 > $OUT/work/conformance.log 2>&1
echo "conformance exit $?"; grep -E -A1 "^ *(fail|crash|timeout) " $OUT/work/conformance.log; grep "^conformance:" $OUT/work/conformance.log
timeout 190 python3 -m pytest tests -m gpu -n 8 -v -p no:cacheprovider -rfE --tb=short > $OUT/work/gpu_tests.log 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|^=+ .*(passed|failed|error).* =+$" $OUT/work/gpu_tests.log; grep -c " PASSED" $OUT/work/gpu_tests.log
RLT_SPEC_BATCHES=256 RLT_SPEC_ACCEPTANCE=0.9 RLT_SPEC_CONFIGS=adaptive timeout 70 python3 -m perf.bench_speculative --out $OUT/spec 2>&1 | tail -6
