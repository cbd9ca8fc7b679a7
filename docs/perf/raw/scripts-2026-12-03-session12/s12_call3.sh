python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
OUT=$OUT CONF_CASES=72 CONF_WORKERS=8 CONF_BUDGET=380 CONF_TIMEOUT=440 PART_TIMEOUT=440 WORKERS=6 WORK=$OUT/work bash perf/run_gpu.sh tests 2>&1 | tail -30
rm -f $OUT/results.tgz
timeout 130 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed > $OUT/fp8.log 2>&1; echo fp8 rc $?
tail -12 $OUT/fp8.log | cut -c1-300
