#!/usr/bin/env bash
# Session 43: the FP8 decode attention at 2 warps on the GPU: its kernel tests (FP8 and attention, gpu marker)
# beside ten conformance cases with FP8 K/V (four with speculation), each with its own time limit.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/v
timeout -s INT -k 20 330 python3 -m pytest tests/kernels/test_fp8_kv.py tests/kernels/test_attention.py -m gpu -n 5 -q \
  -p no:cacheprovider -rfE --tb=short > $OUT/v/gpu_tests.log 2>&1 &
only=()
for c in c002 c013 c022 c027 c035 c040 c043 c055 c063 c068; do only+=(--only "$c "); done
timeout 340 python3 -m perf.conformance --out $OUT/v/conformance --cases 72 --seed 0 --workers 4 --budget-s 320 \
  "${only[@]}" > $OUT/v/conformance.log 2>&1
echo "conformance exit $?"
wait
tail -n 15 $OUT/v/gpu_tests.log
grep -E -A1 "^ *(fail|crash|timeout) " $OUT/v/conformance.log; grep "^conformance:" $OUT/v/conformance.log
cd $OUT && tar czf v.tgz v && rm -rf v
