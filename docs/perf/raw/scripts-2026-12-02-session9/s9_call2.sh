#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 200 python3 scratch/fp8_w8a8.py $OUT > $OUT/fp8_w8a8.log 2>&1; echo "w8a8 rc $?"; grep -v Warn $OUT/fp8_w8a8.log | tail -34
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_widen.py tests/kernels/test_fp8_linear.py -n 8 > $OUT/tests.log 2>&1; echo "fp8 tests rc $?"; tail -2 $OUT/tests.log; grep -E "^(FAILED)" $OUT/tests.log | head -10
