# Session 21, call 1: FP8 K/V read as words in the decode kernel -- kernel tests on the GPU, the whole
# GPU suite, decode attention over bf16 and FP8 caches (words and the per-byte cast) in one run.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 120 python3 -m pytest tests/kernels/test_fp8_kv.py tests/kernels/test_widen.py tests/kernels/test_rope_paged_attention.py -n 8 -q -p no:cacheprovider -rfE --tb=short > $OUT/fp8_kv_tests.log 2>&1
echo "fp8 kv tests rc=$?" >> $OUT/fp8_kv_tests.log; tail -8 $OUT/fp8_kv_tests.log
timeout 160 python3 -m perf.bench_decode_attention --out $OUT/decode_attention --cases 1x192,64x192,256x192,256x1024,64x4096 > $OUT/decode_attention.log 2>&1
echo "bench rc=$?"; tail -9 $OUT/decode_attention.log
timeout 270 python3 -m pytest tests -m gpu -n 8 -q -p no:cacheprovider -rfE --tb=short --durations=10 > $OUT/gpu_tests.log 2>&1
echo "pytest rc=$?" >> $OUT/gpu_tests.log; grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/gpu_tests.log | tail -20
