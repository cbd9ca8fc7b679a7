python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p $OUT/work
git log --oneline -1
(timeout 445 python3 -m perf.conformance --out $OUT/work/conformance --cases 72 --seed 0 --workers 8 --budget-s 430 > $OUT/work/conformance.log 2>&1; echo "conformance exit $?" >> $OUT/work/conformance.log) &
timeout 440 python3 -m pytest tests -m gpu -n 6 -v -p no:cacheprovider -rfE --tb=short > $OUT/work/gpu_tests.log 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|^=+ .*(passed|failed|error).* =+$" $OUT/work/gpu_tests.log; grep -c " PASSED" $OUT/work/gpu_tests.log
wait
grep -E -A1 "^ *(fail|crash|timeout) " $OUT/work/conformance.log | head -20; tail -6 $OUT/work/conformance.log
