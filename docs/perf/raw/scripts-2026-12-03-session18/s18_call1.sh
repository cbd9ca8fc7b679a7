# Session 18 call 1: column pieces for live row tiles (early exit at the batch-256 bucket).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p $OUT/new $OUT/old $OUT/engine
date +%T
timeout 150 python3 -m pytest tests/kernels/test_gemm.py -m gpu -q -p no:cacheprovider --tb=short -k "graph_replay or model_shapes" 2>&1 | tail -8 | tee $OUT/gpu_tests.log
date +%T
timeout 140 python3 -m perf.bench_decode_chain --out $OUT/new --batches 256 --live 256,192,128,64 2>&1 | grep -E "^batch|Error|error" | tee $OUT/chain_new.log
date +%T
cp rlt_kernels/gemm.py /tmp/gemm_new.py && cp scratch/gemm_before_pieces.py rlt_kernels/gemm.py
timeout 120 python3 -m perf.bench_decode_chain --out $OUT/old --batches 256 --live 256,192,128,64 2>&1 | grep -E "^batch|Error|error" | tee $OUT/chain_old.log
cp /tmp/gemm_new.py rlt_kernels/gemm.py
date +%T
RLT_ENGINE_BATCHES=1,256 RLT_ENGINE_PARTS=early_exit timeout 230 python3 -m perf.bench_engine --quick --out $OUT/engine 2>&1 | grep -E "^(rlt|early exit|baseline|prefill) " | cut -c1-400
date +%T
