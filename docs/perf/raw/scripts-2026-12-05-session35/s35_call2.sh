# main vs branch fp8-attention-rows engines, same machine.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
for tree in main branch; do
  (cd scratch/${tree}_src && PYTHONPATH=/tmp/site:. timeout 280 python3 -m perf.bench_fp8 --out $OUT/$tree --parts speed \
     --configs bf16 "w8a8 + KV" w8a8 --batches 1 256 --repeats 2 > $OUT/$tree.log 2>&1; echo "$tree rc=$?")
  grep -E "^\| " $OUT/$tree.log | tail -8
done
