#!/usr/bin/env bash
# Session 36 call 1: the decode attention A/B (register caps, fused RoPE), then the engines at batch 256.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv
python3 -c "import triton, torch; print(torch.__version__, triton.__version__)"
timeout 270 python3 scratch/s36_decode_ab.py $OUT/s36_decode_ab.json > $OUT/s36_decode_ab.log 2>&1
echo "ab rc $?"; grep -v "^{'rope'" $OUT/s36_decode_ab.log | tail -60; grep "'rope'" $OUT/s36_decode_ab.log | tail -30
for v in "0 0 bf16" "0 0 w8a8_kv" "96 1 w8a8_kv"; do
  set -- $v
  cfg=$3; [ "$cfg" = w8a8_kv ] && cfg="w8a8 + KV"
  timeout 100 python3 scratch/s36_engines.py $1 $2 --out $OUT/eng_$1_$2_$3 --parts speed --configs "$cfg" --batches 256 --repeats 2 > $OUT/eng_$1_$2_$3.log 2>&1
  echo "engine $v rc $?"; grep -E "ms|tok/s" $OUT/eng_$1_$2_$3.log | tail -6
done
