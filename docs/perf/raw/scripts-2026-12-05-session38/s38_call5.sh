#!/usr/bin/env bash
# Session 38 call 5: conformance case c038 (failed beside others, passed alone) on an idle GPU with
# greedy rounds' draft counts drawn at random, by feature subset.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
run() {  # name seed [features]
  t0=$(date +%s)
  timeout 60 python3 scratch/s38_random_drafts.py scratch/s38_c038.json $OUT/$1.json $2 $3 > $OUT/$1.log 2>&1
  echo "$1 rc $? $(( $(date +%s) - t0 )) s: $(python3 -c "import json; r=json.load(open('$OUT/$1.json')); print(r['status'], r['stats'], r.get('problems', [])[:2])" 2>&1 | cut -c1-700)"
}
timeout 60 python3 -m perf.conformance_case scratch/s38_c038.json $OUT/plain.json > $OUT/plain.log 2>&1
echo "plain rc $?: $(python3 -c "import json; r=json.load(open('$OUT/plain.json')); print(r['status'], r['stats'])")"
run all_s1 1
run all_s2 2
run none_s1 1 -
run penalties_s1 1 penalties
run guided_s1 1 guided
run allowed_s1 1 allowed-ids
run thinking_s1 1 thinking-budget
run none_s2 2 -
