#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 280 python3 scratch/fp8_ksweep.py $OUT > $OUT/fp8_ksweep.log 2>&1; echo "ksweep rc $?"; grep -v Warn $OUT/fp8_ksweep.log | tail -20
