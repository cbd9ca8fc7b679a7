# Session 27, call 4: W8A8 tiles at 64 and 256 rows.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 380 python3 scratch/s27_w8a8_sweep.py $OUT/w8a8_sweep.json 2>&1 | grep -v Warn | cut -c1-330
