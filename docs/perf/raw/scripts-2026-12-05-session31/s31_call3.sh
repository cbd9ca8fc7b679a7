# Session 31, call 3: decode program order A/B (bits and times), then the FP8 engines with heads inner
# (three runs a batch, heaps frozen).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 150 python3 scratch/s31_order.py $OUT/order.json > $OUT/order.log 2>&1; echo "order rc=$?"
grep -v Warn $OUT/order.log | cut -c1-200
timeout 400 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --configs bf16 "w8a8 + KV" > $OUT/fp8_speed.log 2>&1; echo "fp8 rc=$?" >> $OUT/fp8_speed.log
grep -E "^\||^\{|rc=|Error|error" $OUT/fp8_speed.log | cut -c1-300 | tail -30
