python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p $OUT/chain $OUT/gaps
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_pdl.py -m gpu 2>&1 | tail -3
V="dependent launches + in-place merge + RoPE in attention,... + weight prefetch 1 KB/row,... + weight prefetch 2 KB/row (engine),... + weight prefetch 4 KB/row,... + weight prefetch whole rows"
timeout 240 python3 -m perf.bench_decode_chain --out $OUT/chain --batches 1,4,16,64 --variants "$V" 2>&1 | grep -v Warn | tail -24
timeout 150 python3 -m perf.step_gaps --out $OUT/gaps --batch 1 > $OUT/gaps/log.txt 2>&1; echo "gaps exit $?"; grep -v Warn $OUT/gaps/log.txt | tail -40
