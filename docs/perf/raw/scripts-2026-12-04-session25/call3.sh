python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
git log --oneline -1
mkdir -p $OUT/work
timeout 420 python3 -m pytest $(cat scratch/s25_left_tests.txt) -m gpu -n 6 -v -p no:cacheprovider -rfE --tb=short > $OUT/work/gpu_tests_rest.log 2>&1 &
tp=$!
only=""
for c in c048 c049 c050 c051 c052 c053 c054 c055 c056 c057 c058 c059 c060 c061 c062 c063 c064 c066 c067 c068 c069 c070 c071 c044 c047 c046 c043 c040 c038 c037 c035 c031; do only="$only --only $c "; done
timeout 440 python3 -m perf.conformance --out $OUT/work/conformance --cases 72 --seed 0 --workers 8 --budget-s 420 $only > $OUT/work/conformance_rest.log 2>&1
echo "conformance exit $?"
wait $tp
echo "tests exit $?"
grep -E "^(FAILED|ERROR)|^=+ .*(passed|failed|error).* =+$" $OUT/work/gpu_tests_rest.log
grep -E -A1 "^ *(fail|crash|timeout) " $OUT/work/conformance_rest.log; grep "^conformance:" $OUT/work/conformance_rest.log
tar czf $OUT/cases.tgz -C $OUT/work conformance
