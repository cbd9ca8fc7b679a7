python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 80 python3 -m perf.bench_decode_chain --out $OUT/chain --batches 1,4,16 --variants "dependent launches + in-place merge,dependent launches + in-place merge + indices early,dependent launches + in-place merge,dependent launches + in-place merge + indices early" > $OUT/chain.log 2>&1; echo chain rc $?
grep "^batch" $OUT/chain.log
timeout 80 python3 -m pytest tests/kernels/test_attention.py tests/kernels/test_pdl.py tests/kernels/test_fp8_kv.py -q -p no:cacheprovider -n 6 > $OUT/tests.log 2>&1; echo tests rc $?
tail -2 $OUT/tests.log
RLT_ENGINE_BATCHES=1,16,64,256 RLT_ENGINE_PARTS=none timeout 140 python3 -m perf.bench_engine --quick --out $OUT/engine > $OUT/engine.log 2>&1; echo engine rc $?
grep -E "^(rlt|prefill) " $OUT/engine.log | cut -c1-200
timeout 170 python3 -m perf.conformance --out $OUT/conformance --cases 72 --workers 8 --budget-s 150 > $OUT/conformance.log 2>&1; echo conformance rc $?
grep -E "^ *(fail|crash|timeout) " -A1 $OUT/conformance.log | cut -c1-300; grep "^conformance:" $OUT/conformance.log; grep -cE "^ *pass " $OUT/conformance.log
rm -rf $OUT/conformance/cases
