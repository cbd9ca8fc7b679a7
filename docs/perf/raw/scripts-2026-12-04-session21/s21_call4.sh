# Session 21, call 4: c018 (Huginn, FP8 weights) on the code before session 20's W8A8 commit and on today's,
# then the matrix cases call 3's budget left.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
(cd scratch/old && PYTHONPATH=/tmp/site:. timeout 150 python3 -m perf.conformance_case ../c018.json $OUT/c018_old.json > $OUT/c018_old.log 2>&1; echo "old rc=$?" >> $OUT/c018_old.log) &
(PYTHONPATH=/tmp/site:. timeout 150 python3 -m perf.conformance_case scratch/c018.json $OUT/c018_new.json > $OUT/c018_new.log 2>&1; echo "new rc=$?" >> $OUT/c018_new.log) &
export PYTHONPATH=/tmp/site:.
ONLY=(); for c in 035 043 049 050 052 053 055 056 057 058 059 060 061 062 063 064 066 067 068 069 070 071; do ONLY+=(--only "c$c "); done
timeout 230 python3 -m perf.conformance --out $OUT/conf --cases 72 --seed 0 --workers 10 --budget-s 210 "${ONLY[@]}" > $OUT/conformance.log 2>&1
wait
for f in old new; do tail -2 $OUT/c018_$f.log; python3 -c "import json; r=json.load(open('$OUT/c018_$f.json')); print('$f', r['status'], r.get('detail','')[:300])"; done
grep -E "^ *(fail|crash|timeout|not-run) " -A2 $OUT/conformance.log | head -30; grep "^conformance:" $OUT/conformance.log; rm -rf $OUT/conf/cases
