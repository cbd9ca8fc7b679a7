#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 200 python3 scratch/attn_regs.py $OUT > $OUT/attn_regs.log 2>&1; echo "attn_regs rc $?"; grep -v Warn $OUT/attn_regs.log | python3 -c "
import sys, json
for l in sys.stdin:
    try: r = json.loads(l)
    except Exception: print(l.strip()[:200]); continue
    print(r['batch'], r['keys'], r['variant'], round(r['us'], 1), round(r['frac'], 3), r['same_bits'])"
mkdir -p $OUT/m64; SWEEP_ONLY="qkv bf16,o bf16,gate_up bf16,down bf16" SWEEP_ROWS=64 SWEEP_BLOCK_M=64 timeout 200 python3 scratch/skinny_sweep.py $OUT/m64 > $OUT/sweep64.log 2>&1; echo "sweep64 rc $?"; grep -v Warn $OUT/sweep64.log | tail -40
