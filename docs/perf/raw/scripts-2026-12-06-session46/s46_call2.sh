#!/usr/bin/env bash
# Session 46, call 2: FP8 decode attention at 1 warp a program, kernel A/B, then (if one wins at 256 x 150) the engine A/B.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 240 python3 scratch/s46_decode_1warp.py $OUT/micro.json 2>&1 | grep -v -i warn | tee $OUT/micro.log
best=$(python3 - <<'PY'
import json, os
rows = json.load(open(os.environ["OUT"] + "/micro.json"))["rows"]
r = {x["variant"]: min(x["us"]) for x in rows if (x["batch"], x["keys"]) == (256, 150)}
b = min((v for k, v in r.items() if k.startswith("1w")), default=None)
name = min((k for k in r if k.startswith("1w")), key=r.get)
spec = {"1w uncapped": "w1c0", "1w cap192": "w1c192", "1w cap168": "w1c168"}[name]
print(spec if b < 0.98 * r["main 2w cap128"] else "")
PY
)
echo "best: '$best'"
[ -n "$best" ] && timeout 330 python3 scratch/s46_engine_ab.py $OUT/engine.json main $best main $best 2>&1 | grep -v -i warn | tail -8
