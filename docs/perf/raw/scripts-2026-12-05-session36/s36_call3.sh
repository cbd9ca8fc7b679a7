#!/usr/bin/env bash
# Session 36 call 3: fused-prologue A/B against main's kernel, the engines at batch 256, the attention GPU tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=/tmp/site:scratch/old:scratch:. timeout 200 python3 scratch/s36_rope_ab.py $OUT/s36_rope_ab.json > $OUT/s36_rope_ab.log 2>&1
echo "rope ab rc $?"; cat $OUT/s36_rope_ab.log | cut -c1-220
for v in "0 0" "0 1"; do
  set -- $v
  timeout 130 python3 scratch/s36_engines.py $1 $2 --out $OUT/eng3_$1_$2 --parts speed --configs "w8a8 + KV" --batches 256 --repeats 2 > $OUT/eng3_$1_$2.log 2>&1
  echo "engine cap $1 fuse $2 rc $?"; grep -E "^\| w8a8" $OUT/eng3_$1_$2.log | tail -2
done
timeout 150 python3 -m pytest tests/kernels/test_attention.py tests/kernels/test_fp8_kv.py tests/kernels/test_rope_paged_attention.py -m gpu -q -x -p no:cacheprovider -n 4 > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc $?"; tail -5 $OUT/gpu_tests.log
