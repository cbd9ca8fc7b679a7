# Session 20, call 3: GPU kernel tests, W8A8 kernel speed with the tile rules, the engines' decode speed.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 200 python3 -m pytest tests/kernels/test_w8a8.py tests/kernels/test_fp8_linear.py tests/kernels/test_linear_norm.py tests/kernels/test_norms.py tests/kernels/test_gemm.py -n 8 -q -p no:cacheprovider -rfE --tb=short > $OUT/gpu_kernel_tests.log 2>&1
tail -6 $OUT/gpu_kernel_tests.log
timeout 120 python3 scratch/s20_w8a8.py $OUT > $OUT/w8a8_kernels.log 2>&1; echo "kernels rc=$?" >> $OUT/w8a8_kernels.log
grep -E "^(qkv|o|gate_up|down) +M=|rc=" $OUT/w8a8_kernels.log
timeout 330 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --configs bf16 w8a8 "w8a8 + KV" "fp8 weights" > $OUT/fp8_speed.log 2>&1; echo "fp8 rc=$?" >> $OUT/fp8_speed.log
grep -E "^\{|^roofline|rc=" $OUT/fp8_speed.log
