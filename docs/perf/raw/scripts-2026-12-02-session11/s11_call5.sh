python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
RLT_SPEC_BATCHES=1,256 RLT_SPEC_ACCEPTANCE=0.9 RLT_SPEC_CONFIGS=fixed4,adaptive timeout 230 python3 -m perf.bench_speculative --out $OUT/spec > $OUT/spec.log 2>&1
tail -n 12 $OUT/spec.log | cut -c1-300
timeout 215 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --batches 1 64 256 > $OUT/fp8.log 2>&1
tail -n 14 $OUT/fp8.log | cut -c1-300
