#!/usr/bin/env bash
# Session 40 call 3: c038 and c021 under background GPU load, with dependent launches on and off.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
for s in 1 2 3; do python3 scratch/s40_load.py $s 400 & done
T0=$(date +%s)
run() {  # case pdl i
  t0=$(date +%s)
  RLT_PDL=$2 timeout 90 python3 -m perf.conformance_case scratch/$1.json $OUT/$1-pdl$2-$3.result.json > $OUT/$1-pdl$2-$3.log 2>&1
  python3 -c "import json,sys; d=json.load(open('$OUT/$1-pdl$2-$3.result.json')); print('$1 pdl$2 #$3', d['status'], $(date +%s)-$t0, 's', d['detail'][:300])" 2>&1 | tail -1
}
for i in 1 2 3; do for p in 1 0; do run c038 $p $i; run c021 $p $i; [ $(( $(date +%s) - T0 )) -gt 380 ] && break 2; done; done
kill %1 %2 %3 2>/dev/null
echo "total $(( $(date +%s) - T0 )) s"
