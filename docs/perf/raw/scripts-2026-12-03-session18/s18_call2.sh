# Session 18 call 2: speculation (fixed K=4, adaptive) at batches 1 and 256, FP8 speed, on the current code.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p $OUT/spec $OUT/fp8
date +%T
RLT_SPEC_BATCHES=1,256 RLT_SPEC_CONFIGS=fixed4,adaptive RLT_SPEC_ACCEPTANCE=0.9 timeout 290 python3 -m perf.bench_speculative --out $OUT/spec --quick 2>&1 | tail -25 | cut -c1-300
date +%T
timeout 250 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed 2>&1 | tail -20 | cut -c1-300
date +%T
