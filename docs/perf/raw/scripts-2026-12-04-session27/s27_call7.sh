# Session 27, call 7: batch-256 step time against its device time, per engine.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 300 python3 scratch/s27_devtime.py $OUT/devtime.json 2>&1 | grep -v Warn | cut -c1-250 | tail -12
