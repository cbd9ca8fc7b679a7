# Session 18 call 3: the fixed-depth decode program without exit bookkeeping, cache slots in one kernel.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p $OUT/engine
date +%T
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_block_tables.py tests/runtime/test_fixed_depth_steps.py 2>&1 | tail -4 | tee $OUT/gpu_tests.log
date +%T
timeout 60 python3 -m pytest perf/test_bench_kv_routing.py -q -s -p no:cacheprovider -k cache_slots 2>&1 | grep -E "^cache_slots|passed|failed" | tee $OUT/bench_cache_slots.log
date +%T
RLT_ENGINE_BATCHES=1,16,64,256 RLT_ENGINE_PARTS=early_exit timeout 300 python3 -m perf.bench_engine --quick --out $OUT/engine 2>&1 | grep -E "^(rlt|early exit|baseline|prefill) " | cut -c1-300
date +%T
