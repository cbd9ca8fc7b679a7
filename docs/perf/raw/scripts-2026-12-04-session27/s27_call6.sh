# Session 27, call 6: the FP8 benchmark's decode phase twice per engine.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 330 python3 scratch/s27_twice.py $OUT/twice.json 2>&1 | grep -v Warn | cut -c1-250 | tail -20
