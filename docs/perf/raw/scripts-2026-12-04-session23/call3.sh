export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
test -d /tmp/site/pytest || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p $OUT/logs
timeout 170 python -m pytest -q -x -p no:cacheprovider tests/kernels/test_gemm.py tests/kernels/test_fp8_linear.py tests/kernels/test_w8a8.py tests/kernels/test_linear_norm.py -k "gpu or tma" > $OUT/logs/gpu_tests.log 2>&1; echo "tests rc $?"; tail -3 $OUT/logs/gpu_tests.log
timeout 60 python scratch/s23_w8a8_sweep.py $OUT/w8a8_sweep.json 2>&1 | grep -v Warn | tail -4
for mode in old new; do timeout 140 python scratch/s23_prefill_ab.py $mode $OUT/prefill_$mode.json 2>&1 | grep -v Warn | tail -5; done
