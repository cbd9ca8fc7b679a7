python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:.
timeout 120 python3 scratch/s13_attn_ranges.py $OUT/attn_ranges.json 2>&1 | grep -v Warn | tail -90 | cut -c1-150
timeout 100 python3 -m perf.bench_decode_attention --out $OUT/decode_attention 2>&1 | grep -v Warn | tail -14
RLT_ENGINE_BATCHES=1,16,64,256 RLT_ENGINE_PARTS=early_exit timeout 330 python3 -m perf.bench_engine --quick --out $OUT/engine 2>&1 | grep -v Warn | grep -v "^ *_warn" | tail -40 | cut -c1-400
