python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 100 python3 scratch/s11_kd_attn.py $OUT/kd_attn.json 2>&1 | grep -v Warn | tee $OUT/kd_attn.log | cut -c1-400
RLT_ENGINE_BATCHES=1,16,64,256 RLT_ENGINE_PARTS=early_exit timeout 440 python3 -m perf.bench_engine --quick --out $OUT/engine > $OUT/engine.log 2>&1
tail -n 3 $OUT/engine.log | cut -c1-300; cat $OUT/engine/*.md 2>/dev/null | head -100
