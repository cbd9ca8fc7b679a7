#!/usr/bin/env bash
# Session 39 call 2: decode grids with the KV heads fastest (a token's heads side by side): kernels, engines at batch 256.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
timeout -s INT 150 python3 scratch/s39_rows.py $OUT/hf_kernels.json kernels > $OUT/hf_kernels.log 2>&1
echo "kernels rc $? $(( $(date +%s) - t0 )) s"; grep -v "Warn\|warn" $OUT/hf_kernels.log | cut -c1-900
t0=$(date +%s)
timeout -s INT 330 python3 scratch/s39_rows.py $OUT/hf_engines.json engines > $OUT/hf_engines.log 2>&1
echo "engines rc $? $(( $(date +%s) - t0 )) s"; grep -v "Warn\|warn" $OUT/hf_engines.log | grep "^{\|H" | cut -c1-300
