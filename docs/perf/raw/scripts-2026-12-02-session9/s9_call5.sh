#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_widen.py tests/kernels/test_fp8_linear.py tests/kernels/test_gemm.py tests/kernels/test_linear_norm.py -n 8 > $OUT/tests.log 2>&1; echo "kernel tests rc $?"; tail -1 $OUT/tests.log; grep -E "^(FAILED)" $OUT/tests.log | head -10
timeout 150 python3 -m perf.conformance --out $OUT/conf --cases 72 --seed 0 --workers 8 --budget-s 130 --only fp8w > $OUT/conf.log 2>&1; echo "conformance rc $?"; tail -16 $OUT/conf.log
timeout 250 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed > $OUT/fp8.log 2>&1; echo "bench_fp8 rc $?"; grep -v Warn $OUT/fp8.log | tail -13
