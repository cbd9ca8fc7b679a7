python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 150 python3 scratch/s12_flat.py $OUT/flat.json > $OUT/flat.log 2>&1; echo flat rc $?
grep -v Warn $OUT/flat.log | tail -16
timeout 100 python3 -m pytest tests/kernels/test_gemm.py tests/kernels/test_linear_norm.py tests/kernels/test_fp8_linear.py tests/runtime/test_split_k_layers.py -q -p no:cacheprovider -n 6 -k "not ouro_shapes and not model_shapes" > $OUT/tests.log 2>&1; echo tests rc $?
tail -3 $OUT/tests.log
RLT_SPEC_BATCHES=1,256 RLT_SPEC_ACCEPTANCE=0.9 RLT_SPEC_CONFIGS=fixed4,adaptive timeout 170 python3 -m perf.bench_speculative --out $OUT/spec > $OUT/spec.log 2>&1; echo spec rc $?
tail -12 $OUT/spec.log | cut -c1-300
RLT_ENGINE_BATCHES=1,16,64,256 RLT_ENGINE_PARTS=none timeout 150 python3 -m perf.bench_engine --quick --out $OUT/engine > $OUT/engine.log 2>&1; echo engine rc $?
grep -E "^(rlt|baseline|prefill) " $OUT/engine.log | cut -c1-330
