# Session 20, call 2: W8A8 kernel tests on the GPU, then the kernel script (correctness, speed, K-step sweep).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 200 python3 -m pytest tests/kernels/test_w8a8.py tests/kernels/test_fp8_linear.py tests/kernels/test_linear_norm.py tests/kernels/test_norms.py -n 8 -q -p no:cacheprovider -rfE --tb=short > $OUT/gpu_kernel_tests.log 2>&1
tail -15 $OUT/gpu_kernel_tests.log
timeout 330 python3 scratch/s20_w8a8.py $OUT > $OUT/w8a8_kernels.log 2>&1; echo "kernels rc=$?" >> $OUT/w8a8_kernels.log
grep -v "^\s" $OUT/w8a8_kernels.log | tail -32
