# Next GPU session, call 1: the GPU suite on session 18's final code, then the matrix cases its budget left.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 300 python3 -m pytest tests -m gpu -n 8 -q -p no:cacheprovider -rfE --tb=short 2>&1 | tail -25 | tee $OUT/gpu_tests.log
ONLY=(); for c in 035 043 052 055 059 061 063 064 066 067 068 069 070 071; do ONLY+=(--only "c$c "); done
timeout 260 python3 -m perf.conformance --out $OUT/conf --cases 72 --seed 0 --workers 10 --budget-s 240 "${ONLY[@]}" > $OUT/conformance.log 2>&1
grep -E "^ *(fail|crash|timeout) " -A2 $OUT/conformance.log; grep "^conformance:" $OUT/conformance.log; rm -rf $OUT/conf/cases
