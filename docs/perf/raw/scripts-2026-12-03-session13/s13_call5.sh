python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:.
timeout 230 python3 -m perf.conformance --out $OUT/conformance --cases 72 --first 52 --workers 8 --budget-s 210 > $OUT/conformance.log 2>&1
echo "exit $?"
grep -E "^ *(pass|fail|crash|timeout|not-run|not-applicable) " $OUT/conformance.log | cut -c1-60
tail -2 $OUT/conformance.log
