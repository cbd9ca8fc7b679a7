# Session 22, call 4: speculation with disable_by_batch_size counting running + waiting requests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
RLT_SPEC_BATCHES=1,256 RLT_SPEC_CONFIGS=fixed4,adaptive RLT_SPEC_ACCEPTANCE=0.9 timeout 420 python3 -m perf.bench_speculative --out $OUT/spec > $OUT/spec.log 2>&1
echo "spec rc=$?"; grep -E "^(native|fixed4|adaptive)" $OUT/spec.log | cut -c1-420; tail -3 $OUT/spec.log
