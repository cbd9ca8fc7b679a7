python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:.
timeout 150 python3 scratch/s13_attn_ranges.py $OUT/attn_ranges.json 2>&1 | grep -v Warn | tail -110
timeout 200 python3 scratch/s13_timeline.py $OUT/timeline 2>&1 | grep -v Warning | tail -40
timeout 150 python3 -m perf.step_gaps --out $OUT/gaps --batch 1 --min-gap-us 15 2>&1 | tail -8
