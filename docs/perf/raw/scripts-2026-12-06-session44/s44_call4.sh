#!/usr/bin/env bash
# Session 44, call 4: with RoPE fused into every FP8 decode launch: the fused-pass GPU tests (the new full
# FP8 launch among them), the 2^31-element routing test (it ran out of memory beside the matrix), the FP8
# engine GPU tests; beside them the 38 matrix cases (seed 0) that call 2's budget left unrun.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/c4
timeout -s INT -k 20 400 python3 -m pytest -m gpu -n 3 -p no:cacheprovider -rfE --tb=short \
  tests/kernels/test_rope_paged_attention.py "tests/kernels/test_routing.py::test_finalize_cache_past_2_pow_31_elements" \
  tests/runtime/test_engine_gpu.py -k "fused or finalize or fp8 or kv" > $OUT/c4/gpu_tests.log 2>&1 &
only=()
for c in c031 c032 c034 c035 c036 c037 c038 c039 c040 c041 c042 c043 c044 c046 c047 c048 c049 c050 c051 c052 c053 c054 c055 c056 c057 c058 c059 c060 c061 c062 c063 c064 c066 c067 c068 c069 c070 c071; do only+=(--only "$c "); done
timeout 420 python3 -m perf.conformance --out $OUT/c4/conformance --cases 72 --seed 0 --workers 4 --budget-s 400 "${only[@]}" > $OUT/c4/conformance.log 2>&1
echo "conformance rc $?"; grep "^conformance:" $OUT/c4/conformance.log; grep -E -A1 "^ *(fail|crash|timeout) " $OUT/c4/conformance.log | head -20
wait
grep -E "^(FAILED|ERROR)|^=+ .*(passed|failed|error).* =+$" $OUT/c4/gpu_tests.log
cd $OUT && tar czf c4.tgz c4 && rm -rf c4
