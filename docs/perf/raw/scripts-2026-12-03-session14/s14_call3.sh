set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:.
timeout 80 python3 -m pytest -q -p no:cacheprovider -m "" tests/kernels/test_attention.py -k "decode_range or split or merged_in_place" 2>&1 | tail -3
RLT_ENGINE_BATCHES=1,16,64,256 RLT_ENGINE_PARTS=early_exit timeout 230 python3 -m perf.bench_engine --quick --out $OUT/engine 2>&1 | grep -E "^(rlt|early exit|baseline|prefill) " | cut -c1-400
timeout 110 python3 -m perf.bench_decode_attention --out $OUT/decode_attn 2>&1 | tail -14
RLT_SPEC_BATCHES=1,256 RLT_SPEC_ACCEPTANCE=0.9 RLT_SPEC_CONFIGS=fixed4,adaptive timeout 140 python3 -m perf.bench_speculative --out $OUT/spec 2>&1 | tail -12
