set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:.
timeout 170 python3 scratch/s14_attn_old_new.py $OUT/attn_old_new.json 2>&1 | grep -v Warning | tail -30
timeout 170 python3 scratch/s14_chain_spans2.py $OUT/chain_spans2.json 2>&1 | grep -v Warning | tail -40
timeout 150 python3 -m perf.step_gaps --out $OUT/gaps_ee --batch 256 --early-exit 2>&1 | grep -v Warning | tail -8
