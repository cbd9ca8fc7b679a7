#!/usr/bin/env bash
# Session 40 call 2: 16-row tiles against the decode kernel (stock, then FP8 widened to fp16 in registers); c021 and c038 again.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
timeout -s INT 170 python3 scratch/s39_tile16.py $OUT/tile16.json > $OUT/tile16.log 2>&1
echo "tile16 rc $? $(( $(date +%s) - t0 )) s"; grep -v "Warn\|warn" $OUT/tile16.log | cut -c1-1500
t0=$(date +%s)
timeout -s INT 120 python3 -m perf.conformance --out /tmp/w2 --cases 72 --seed 0 --workers 2 --budget-s 110 --only "c021 " --only "c038 " > $OUT/conf2.log 2>&1
echo "conf rc $? $(( $(date +%s) - t0 )) s"; grep -E "pass|fail|^conformance" $OUT/conf2.log | cut -c1-600
cp -r /tmp/w2 $OUT/conf2 2>/dev/null
patch -p1 < scratch/s39_tile16_f16_widen_experiment.patch > /dev/null && echo patched
t0=$(date +%s)
timeout -s INT 170 python3 scratch/s39_tile16.py $OUT/tile16w.json > $OUT/tile16w.log 2>&1
echo "tile16w rc $? $(( $(date +%s) - t0 )) s"; grep -v "Warn\|warn" $OUT/tile16w.log | cut -c1-1500
