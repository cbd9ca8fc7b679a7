#!/usr/bin/env bash
# Session 40 call 4: c021 variants on an idle GPU, dependent launches off (and on for the base).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 230 python3 scratch/s40_variants.py /tmp/v
