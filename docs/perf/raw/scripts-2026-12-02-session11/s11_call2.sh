python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 120 python3 scratch/s11_down.py $OUT/down.json 2>&1 | grep -v Warn | tee $OUT/down.log | cut -c1-400
timeout 200 python3 scratch/s11_engine_attn.py $OUT/engine_attn.json > $OUT/engine_attn.log 2>&1; grep -v Warn $OUT/engine_attn.log | tail -n 30 | cut -c1-600
timeout 200 python3 -m pytest tests/kernels/test_gemm.py tests/kernels/test_linear_norm.py tests/kernels/test_fp8_linear.py -q -p no:cacheprovider -n 6 2>&1 | tail -n 4 | tee $OUT/tests.log
RLT_ENGINE_BATCHES=1,64,256 RLT_ENGINE_PARTS=none timeout 300 python3 -m perf.bench_engine --quick --out $OUT/engine > $OUT/engine.log 2>&1
tail -n 3 $OUT/engine.log | cut -c1-300; cat $OUT/engine/*.md 2>/dev/null | head -80
