#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tail -1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_widen.py tests/kernels/test_fp8_linear.py tests/kernels/test_gemm.py -m gpu -n 8 > $OUT/tests.log 2>&1; echo "gpu tests rc $?"; tail -2 $OUT/tests.log; grep -E "^(FAILED|E )" $OUT/tests.log | head -10
timeout 130 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_widen.py tests/kernels/test_fp8_linear.py tests/kernels/test_gemm.py -n 8 -m "not gpu" -x > $OUT/tests_cpu_on_gpu.log 2>&1; echo "non-gpu tests on cuda rc $?"; tail -2 $OUT/tests_cpu_on_gpu.log
timeout 280 python3 scratch/fp8_ab.py $OUT > $OUT/fp8_ab.log 2>&1; echo "fp8_ab rc $?"; grep -v Warn $OUT/fp8_ab.log | tail -24
