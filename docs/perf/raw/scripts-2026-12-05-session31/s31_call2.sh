# Session 31, call 2: the FP8 engines on main (one program per KV head), three runs a batch, heaps frozen.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
git log --oneline -1 2>/dev/null
timeout 570 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --configs bf16 "w8a8 + KV" w8a8 > $OUT/fp8_speed.log 2>&1; echo "fp8 rc=$?" >> $OUT/fp8_speed.log
grep -E "^\||^\{|^roofline|rc=|Error|error" $OUT/fp8_speed.log | cut -c1-300 | tail -30
