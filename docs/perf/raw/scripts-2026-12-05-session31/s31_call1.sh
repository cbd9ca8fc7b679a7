python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 185 python3 scratch/s31_kvt.py $OUT/kvt.json > $OUT/kvt.log 2>&1; echo "kvt rc=$?"
grep -v Warn $OUT/kvt.log | cut -c1-200
bash scratch/s31_engine.sh
