python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
python3 -c "import torch,triton;print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
timeout 280 python3 scratch/tma_sweep.py 2>&1 | tee $OUT/tma.log | grep -v Warning
timeout 150 python3 -m pytest tests/kernels/test_fp8_kv.py tests/kernels/test_attention.py tests/kernels/test_gemm.py -q -x -p no:cacheprovider -n 4 2>&1 | tail -5 | tee $OUT/tests.log
timeout 140 python3 -m perf.bench_decode_chain --out $OUT/chain_fp8 --fp8 --ablate --batches 1,64 > $OUT/chain_fp8.log 2>&1; grep -E "^batch|ablat|µs|us" $OUT/chain_fp8.log | head -30
