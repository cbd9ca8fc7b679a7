python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest tests/kernels/test_gemm.py tests/kernels/test_linear_norm.py tests/kernels/test_fp8_linear.py tests/runtime/test_split_k_layers.py -q -p no:cacheprovider -n 6 > $OUT/tests.log 2>&1; echo tests rc $?
tail -3 $OUT/tests.log
timeout 230 python3 -m perf.conformance --out $OUT/conformance --cases 72 --first 52 --workers 8 --budget-s 200 > $OUT/conformance.log 2>&1; echo conformance rc $?
grep -E "^ *(pass|fail|crash|timeout|not-run|not-applicable) " $OUT/conformance.log | cut -c1-60; grep "^conformance:" $OUT/conformance.log
rm -rf $OUT/conformance/cases
