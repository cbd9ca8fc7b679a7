#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_fp8_kv.py tests/kernels/test_rope_paged_attention.py \
  -q 2>&1 | tail -15 | tee $OUT/gpu-tests.log
timeout 200 python3 scratch/s49/ab_decode.py $OUT/ab.json 2>&1 | tail -30
