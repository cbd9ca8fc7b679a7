#!/bin/bash
# Session 49, call 1: W8A8 middle-row tile sweep (the batch-256 step's linear layers); on an H200 the
# FP8 engines against bf16 first.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch,triton;print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
git log --oneline -1 | tee -a $OUT/gpu.txt
T=440
if grep -q H200 $OUT/gpu.txt; then
  timeout 300 python3 -m perf.bench_fp8 --out $OUT/f --parts speed --repeats 1 --configs bf16 "w8a8 + KV" w8a8 --batches 1 256 > $OUT/bench.log 2>&1
  tail -20 $OUT/bench.log
  T=250
fi
end=$((SECONDS + T))
for w in down gate_up qkv o; do
  left=$((end - SECONDS)); [ $left -lt 30 ] && break
  RLT_GEMM_SWEEP=1 timeout $left python3 -m pytest "perf/test_bench_gemm.py::test_bench_linear_w8a8_mid_sweep[ouro.$w]" \
    -s -q -p no:cacheprovider --benchmark-json=$OUT/w8a8-mid-sweep-$w.json > $OUT/sweep-$w.log 2>&1
  grep -E "chosen|best at|^  \{|passed|failed|Error" $OUT/sweep-$w.log | head -24
done
