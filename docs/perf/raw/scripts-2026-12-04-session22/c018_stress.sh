#!/usr/bin/env bash
# Variants of c018 side by side, two rounds, with GEMM noise processes.
set -u
D=$OUT/c018; mkdir -p $D
python3 - <<'PY'
import json, os
c = json.load(open("scratch/c018.json"))
D = os.environ["OUT"] + "/c018"
variants = {"orig": {}, "sync": {"async_scheduling": False}, "eager": {"execution_mode": "eager"},
            "noquant": {"quantization": None}}
for name, over in variants.items():
    d = dict(c, **over); d["alone"] = False
    json.dump(d, open(f"{D}/{name}.json", "w"))
PY
noise() { python3 - <<'PY'
import torch, time
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t = time.time()
while time.time() - t < 45:
    for _ in range(20): a @ a
    torch.cuda.synchronize()
PY
}
for round in 1 2; do
  noise & noise &
  pids=()
  for v in orig orig orig orig orig orig sync sync eager eager noquant noquant; do
    i=${#pids[@]}
    ( timeout 120 python3 -m perf.conformance_case $D/$v.json $D/r$round-$i-$v.result.json > $D/r$round-$i-$v.log 2>&1 ) &
    pids+=($!)
  done
  wait
  for f in $D/r$round-*.result.json; do python3 -c "import json,sys;r=json.load(open('$f'));print('$f'.split('/')[-1], r['status'], r['detail'][:300])"; done
done
noise & noise &
for i in 0 1 2 3 4 5; do ( timeout 150 python3 scratch/c018_repeat.py $D/orig.json > $D/repeat-$i.log 2>&1 ) & done
wait
tail -n 13 $D/repeat-*.log
