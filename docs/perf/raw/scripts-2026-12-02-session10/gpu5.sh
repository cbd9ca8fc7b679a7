python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 200 python3 scratch/skinny_tma_sweep.py 2>&1 | grep -v Warn | tee $OUT/skinny_tma.log
timeout 265 python3 -m pytest tests -m gpu -n 6 -q -p no:cacheprovider -rfE > $OUT/gpu_tests.log 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_tests.log | tail -15
