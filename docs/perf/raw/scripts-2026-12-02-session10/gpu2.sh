python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 100 python3 scratch/rule_check.py 2>&1 | grep -v Warn | tee $OUT/rule_check.log
timeout 120 python3 -m pytest tests/kernels/test_gemm.py tests/kernels/test_linear_norm.py tests/kernels/test_fp8_linear.py -q -p no:cacheprovider -n 4 2>&1 | tail -4 | tee $OUT/tests.log
RLT_ENGINE_BATCHES=1,64,256 RLT_ENGINE_PARTS=early_exit timeout 330 python3 -m perf.bench_engine --out $OUT --quick > $OUT/engine.log 2>&1
grep -E "^(roofline|baseline|rlt|prefill|early exit)" $OUT/engine.log | cut -c1-400
