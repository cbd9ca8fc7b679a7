#!/usr/bin/env bash
# Session 46, call 4: the FP8 decode kernel at one warp a program: its GPU tests beside the 22 matrix cases with FP8 K/V.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p $OUT/c4
timeout -s INT -k 15 370 python3 -m pytest -m gpu -n 3 -p no:cacheprovider -rfE --tb=short tests/kernels/test_fp8_kv.py \
  tests/kernels/test_rope_paged_attention.py tests/kernels/test_attention.py tests/kernels/test_pdl.py \
  tests/runtime/test_engine_gpu.py > $OUT/c4/gpu_tests.log 2>&1 &
only=()
for c in c002 c008 c013 c020 c022 c023 c024 c026 c027 c030 c031 c035 c040 c043 c047 c052 c055 c060 c063 c066 c067 c068; do only+=(--only "$c "); done
timeout 390 python3 -m perf.conformance --out $OUT/c4/conformance --cases 72 --seed 0 --workers 4 --budget-s 370 "${only[@]}" > $OUT/c4/conformance.log 2>&1
echo "conformance rc $?"; grep "^conformance:" $OUT/c4/conformance.log; grep -E "^ *(pass|fail|crash|timeout|not-run|not-applicable)" $OUT/c4/conformance.log | awk '{print $1}' | sort | uniq -c
grep -E -A2 "^ *(fail|crash|timeout) " $OUT/c4/conformance.log | head -20
wait
grep -E "^(FAILED|ERROR)|^=+ .*(passed|failed|error).* =+$" $OUT/c4/gpu_tests.log
cd $OUT && tar czf c4.tgz c4 && rm -rf c4
