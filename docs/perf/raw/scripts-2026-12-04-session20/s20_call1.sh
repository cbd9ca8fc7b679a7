# Session 20, call 1: W8A8 kernels (correctness, speed, K-step sweep), then the engines' decode speed.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
timeout 270 python3 scratch/s20_w8a8.py $OUT > $OUT/w8a8_kernels.log 2>&1; echo "kernels rc=$?" >> $OUT/w8a8_kernels.log
timeout 300 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --configs bf16 w8a8 "w8a8 + KV" "fp8 weights" > $OUT/fp8_speed.log 2>&1; echo "fp8 rc=$?" >> $OUT/fp8_speed.log
tail -5 $OUT/w8a8_kernels.log; grep -E "^\{|^roofline" $OUT/fp8_speed.log
