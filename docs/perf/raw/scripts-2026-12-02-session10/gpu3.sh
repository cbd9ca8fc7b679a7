python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
FP8=1 timeout 100 python3 scratch/rule_check.py 2>&1 | grep -v Warn | tee $OUT/rule_check_fp8.log
timeout 90 python3 -m pytest tests/kernels/test_gemm.py tests/kernels/test_linear_norm.py tests/kernels/test_fp8_linear.py -q -p no:cacheprovider -n 4 2>&1 | tail -4 | tee $OUT/tests.log
timeout 300 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed > $OUT/fp8.log 2>&1; tail -n 14 $OUT/fp8.log
