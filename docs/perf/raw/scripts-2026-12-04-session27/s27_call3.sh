# Session 27, call 3: FP8 decode attention geometries; then the FP8 engines on the current code.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 200 python3 scratch/s27_fp8_geom.py $OUT/fp8_geom.json > $OUT/fp8_geom.log 2>&1; echo "geom rc=$?"
grep -v Warn $OUT/fp8_geom.log | cut -c1-200 | tail -70
timeout 300 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --configs bf16 "w8a8 + KV" w8a8 > $OUT/fp8_speed.log 2>&1; echo "fp8 rc=$?" >> $OUT/fp8_speed.log
grep -E "^\{|^roofline|rc=" $OUT/fp8_speed.log | cut -c1-400
