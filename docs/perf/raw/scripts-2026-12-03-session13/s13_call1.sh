set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
timeout 200 python3 scratch/s13_timeline.py $OUT/timeline 2>&1 | grep -v Warning | tail -80
timeout 60 python3 scratch/s13_attn_split.py $OUT/attn_split.json 2>&1 | tail -30
timeout 150 python3 -m perf.bench_decode_chain --out $OUT/chain --batches 1,16 --variants "dependent launches + in-place merge" --ablate 2>&1 | tail -30
