#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tail -1
timeout 170 python3 scratch/attn_ab.py $OUT > $OUT/attn_ab.log 2>&1; echo "attn_ab rc $?"; grep -v Warn $OUT/attn_ab.log | tail -22
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention.py -m gpu -n 4 > $OUT/attn_tests.log 2>&1; echo "attn gpu tests rc $?"; tail -2 $OUT/attn_tests.log; grep -E "^(FAILED|E )" $OUT/attn_tests.log | head -10
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
timeout 120 $NCU --clock-control none --kernel-name regex:"_decode_attention_kernel|_linear_kernel" --launch-skip 0 --launch-count 14 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  --csv --page details python3 scratch/ncu_target.py > $OUT/ncu.csv 2> $OUT/ncu.err; echo "ncu rc $?"; tail -3 $OUT/ncu.err
BASELINE=1 NOBD=1 timeout 200 python3 scratch/engine_quick.py $OUT 64,256 > $OUT/engine.log 2>&1; echo "engine rc $?"; grep -E "^(rlt|meta|baseline)|Error" $OUT/engine.log | head -20
