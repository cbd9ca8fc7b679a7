#!/usr/bin/env bash
# Session 39 call 3: 16-row tensor-core tiles for one-query rows against the decode kernel; the
# attention GPU tests with the heads-first decode grid.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
timeout -s INT 170 python3 scratch/s39_tile16.py $OUT/tile16.json > $OUT/tile16.log 2>&1
echo "tile16 rc $? $(( $(date +%s) - t0 )) s"; grep -v "Warn\|warn" $OUT/tile16.log | cut -c1-1200
t0=$(date +%s)
timeout -s INT 150 python3 -m pytest tests/kernels/test_attention.py tests/kernels/test_fp8_kv.py tests/kernels/test_rope_paged_attention.py -m gpu -q -p no:cacheprovider -n 4 > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc $? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|ERROR" $OUT/gpu_tests.log | tail -8
