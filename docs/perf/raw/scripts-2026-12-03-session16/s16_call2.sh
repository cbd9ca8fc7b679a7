python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p $OUT/chain
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_rope_paged_attention.py tests/kernels/test_attention.py tests/kernels/test_pdl.py -m gpu 2>&1 | tail -3
timeout 150 python3 -m perf.bench_decode_chain --out $OUT/chain --batches 1,4,16,64 --variants "dependent launches + in-place merge + RoPE in attention" 2>&1 | grep -v Warn | tail -5
timeout 200 python3 scratch/s16_split.py $OUT/chain/split_sizes.json 2>&1 | grep -v Warn | tail -14
