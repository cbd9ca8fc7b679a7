python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 150 python3 scratch/s24_o_split.py $OUT/o_split.json 2>&1 | grep -v "^ *$" | tail -25
RLT_SPEC_BATCHES=1,16,64,256 RLT_SPEC_CONFIGS=adaptive RLT_SPEC_ACCEPTANCE=0.7 timeout 330 python3 -m perf.bench_speculative --out $OUT/spec > $OUT/spec.log 2>&1
echo "spec rc=$?"; grep -E "^\| " $OUT/spec.log | tail -6
