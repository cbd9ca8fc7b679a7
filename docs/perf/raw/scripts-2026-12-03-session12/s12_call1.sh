set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv
timeout 230 python3 scratch/s12_split.py $OUT/split.json > $OUT/split.log 2>&1; echo split rc $?
tail -40 $OUT/split.log
timeout 120 python3 -m pytest tests/kernels/test_gemm.py tests/kernels/test_linear_norm.py tests/kernels/test_fp8_linear.py tests/runtime/test_split_k_layers.py -q -p no:cacheprovider -n 6 -k "not ouro_shapes and not model_shapes" > $OUT/tests.log 2>&1; echo tests rc $?
tail -5 $OUT/tests.log
RLT_ENGINE_BATCHES=1,16,64,256 RLT_ENGINE_PARTS=cublas timeout 250 python3 -m perf.bench_engine --quick --out $OUT/engine > $OUT/engine.log 2>&1; echo engine rc $?
grep -E "^(rlt|baseline|cublas|prefill) " $OUT/engine.log | cut -c1-400
