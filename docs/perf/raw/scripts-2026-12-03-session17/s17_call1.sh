# Next GPU session: A/B of the split-decode dependent-launch rule in the chain (64K tables, engine-like)
# and the engine. Old rule = attention.py of d75b33f (scratch/attention_rows_counted_all.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p $OUT/new $OUT/old
E="dependent launches + in-place merge + RoPE in attention"
timeout 150 python3 -m perf.bench_decode_chain --out $OUT/new --batches 1,4,8,16 --variants "$E" 2>&1 | grep "^batch"
cp rlt_kernels/attention.py /tmp/attention_new.py && cp scratch/attention_rows_counted_all.py rlt_kernels/attention.py
timeout 150 python3 -m perf.bench_decode_chain --out $OUT/old --batches 1,4,8,16 --variants "$E" 2>&1 | grep "^batch"
cp /tmp/attention_new.py rlt_kernels/attention.py
RLT_ENGINE_BATCHES=1,16,64,256 RLT_ENGINE_PARTS=early_exit timeout 280 python3 -m perf.bench_engine --quick --out $OUT/engine 2>&1 | tail -20
