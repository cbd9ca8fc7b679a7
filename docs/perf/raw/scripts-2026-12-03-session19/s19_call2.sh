# Session 19, call 2: the whole GPU suite (durations), then decode attention as the engine runs it.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 430 python3 -m pytest tests -m gpu -n 8 -q -p no:cacheprovider -rfE --tb=short --durations=30 > $OUT/gpu_tests.log 2>&1
echo "pytest rc=$?" >> $OUT/gpu_tests.log; tail -45 $OUT/gpu_tests.log
timeout 170 python3 -m perf.bench_decode_attention --out $OUT/decode_attention > $OUT/decode_attention.log 2>&1
echo "bench rc=$?"; tail -25 $OUT/decode_attention.log
