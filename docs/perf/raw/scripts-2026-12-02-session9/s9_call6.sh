#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fp8_linear.py tests/kernels/test_widen.py -n 8 > $OUT/tests.log 2>&1; echo "fp8 kernel tests rc $?"; tail -1 $OUT/tests.log; grep -E "^(FAILED|E  )" $OUT/tests.log | head -8
timeout 55 python3 scratch/fp8_modes.py $OUT > $OUT/fp8_modes.log 2>&1; echo "modes rc $?"; grep -v Warn $OUT/fp8_modes.log | tail -16
timeout 125 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --configs "fp8 weights + activations" > $OUT/fp8.log 2>&1; echo "bench_fp8 rc $?"; grep -v Warn $OUT/fp8.log | grep -E "^\||^\{" | tail -8
