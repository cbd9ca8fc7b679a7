set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
timeout 170 python3 -m pytest -q -p no:cacheprovider -m "" -x tests/kernels/test_gemm.py -k "spans or skinny or gpu_model or graph_replay or invariant" 2>&1 | tail -5
timeout 240 python3 scratch/s14_gemv_spans.py $OUT/gemv_spans.json 2>&1 | grep -v Warning | tail -120
timeout 120 python3 scratch/s14_chain_spans.py $OUT/chain_spans.json 2>&1 | grep -v Warning | tail -20
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_attention.py tests/runtime/test_split_attention_engine.py -k split 2>&1 | tail -5
