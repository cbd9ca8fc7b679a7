# Session 27, call 5: kernel breakdown of the bf16 and W8A8 engines' decode steps.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 420 python3 scratch/s27_profile.py $OUT/profile.json 2>&1 | grep -v Warn | cut -c1-200
