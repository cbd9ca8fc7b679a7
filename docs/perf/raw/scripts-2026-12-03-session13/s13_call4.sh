python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:.
OUT=$OUT CONF_CASES=72 CONF_WORKERS=8 CONF_BUDGET=370 CONF_TIMEOUT=430 PART_TIMEOUT=430 WORKERS=6 WORK=$OUT/work bash perf/run_gpu.sh tests 2>&1 | tail -30
rm -f $OUT/results.tgz
RLT_ENGINE_BATCHES=1,16 RLT_ENGINE_PARTS=none timeout 125 python3 -m perf.bench_engine --quick --out $OUT/engine 2>&1 | grep -v Warn | grep -E "^rlt|^baseline" | cut -c1-300
