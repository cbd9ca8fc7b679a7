#!/usr/bin/env bash
# Session 43, second verify call: the FP8 GPU tests by name (the new full-launch test first), c035 alone.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p $OUT/v2
timeout -s INT -k 10 190 python3 -m pytest tests/kernels/test_fp8_kv.py -m gpu -v -p no:cacheprovider -rfE --tb=short \
  > $OUT/v2/gpu_tests.log 2>&1 &
timeout 200 python3 -m perf.conformance --out $OUT/v2/conformance --cases 72 --seed 0 --workers 1 --budget-s 195 \
  --only "c035 " > $OUT/v2/conformance.log 2>&1
wait
grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/v2/gpu_tests.log | tail -20
grep "^conformance:" $OUT/v2/conformance.log; grep -E "^\| c035" $OUT/v2/conformance/conformance.md
cd $OUT && tar czf v2.tgz v2 && rm -rf v2
