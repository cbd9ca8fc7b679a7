#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv | tail -1; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_widen.py tests/kernels/test_fp8_linear.py tests/kernels/test_gemm.py tests/kernels/test_linear_norm.py -n 8 > $OUT/tests.log 2>&1; echo "kernel tests (gpu + rest on cuda) rc $?"; tail -1 $OUT/tests.log; grep -E "^(FAILED)" $OUT/tests.log | head -10
timeout 170 python3 scratch/fp8_inline_sweep.py $OUT > $OUT/fp8_inline_sweep.log 2>&1; echo "sweep rc $?"; grep -v Warn $OUT/fp8_inline_sweep.log | tail -20
timeout 270 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed > $OUT/fp8.log 2>&1; echo "bench_fp8 rc $?"; grep -v Warn $OUT/fp8.log | tail -14
