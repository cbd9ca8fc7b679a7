nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch,triton;print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
git log --oneline -1 | tee -a $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then
  timeout 570 python3 -m perf.bench_fp8 --out $OUT/f --parts speed --repeats 2 --configs bf16 "w8a8 + KV" w8a8 --batches 1 256 > $OUT/bench.log 2>&1
  tail -30 $OUT/bench.log
else
  echo "not an H200: nothing run"
fi
