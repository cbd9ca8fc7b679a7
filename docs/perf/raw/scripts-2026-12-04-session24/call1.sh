python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 scratch/s24_qx.py $OUT/qx.json 2>&1 | tail -20
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_w8a8.py tests/kernels/test_linear_norm.py tests/kernels/test_gemm.py tests/kernels/test_fp8_linear.py -x 2>&1 | tail -8
