python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 80 python3 -m pytest tests/kernels/test_gemm.py tests/kernels/test_linear_norm.py tests/kernels/test_fp8_linear.py -q -p no:cacheprovider -n 4 2>&1 | tail -3 | tee $OUT/tests.log
timeout 470 python3 -m perf.conformance --out $OUT/conf --cases 72 --seed 0 --workers 8 --budget-s 430 > $OUT/conformance.log 2>&1
echo "exit $?"; grep -E -A1 "^ *(fail|crash|timeout) " $OUT/conformance.log | head -30; grep "^conformance:" $OUT/conformance.log
