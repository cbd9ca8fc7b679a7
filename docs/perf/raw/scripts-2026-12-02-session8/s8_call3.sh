#!/usr/bin/env bash
set -u
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 130 python3 scratch/attn_pipe.py $OUT > $OUT/attn_pipe.log 2>&1; echo "attn_pipe rc $? at $((SECONDS-T0))s"; grep -v Warn $OUT/attn_pipe.log | python3 -c "
import sys, json
for l in sys.stdin:
    try: r = json.loads(l)
    except Exception: print(l.strip()[:300]); continue
    print(r['batch'], r['keys'], r['variant'], round(r.get('us', -1), 1), round(r.get('frac', -1), 3), r.get('same_bits'), r.get('error', ''))"
touch $OUT/best_env.sh; cat $OUT/best_env.sh; source $OUT/best_env.sh
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention.py -m gpu -n 8 > $OUT/attn_tests.log 2>&1; echo "attn gpu tests rc $? at $((SECONDS-T0))s"; tail -2 $OUT/attn_tests.log; grep -E "^(FAILED|E )" $OUT/attn_tests.log | head -10
LEFT=$((430 - (SECONDS-T0)))
BASELINE=1 NOBD=1 timeout $LEFT python3 scratch/engine_quick.py $OUT 64,256 > $OUT/engine.log 2>&1; echo "engine rc $? at $((SECONDS-T0))s"; grep -E "^(rlt|meta|baseline)|Error" $OUT/engine.log | head -20
