python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
python3 -c "import torch,triton;print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
timeout 200 python3 scratch/s11_prefill_attn.py $OUT/prefill_attn.json 2>&1 | grep -v Warn > $OUT/prefill_attn.log; tail -n 60 $OUT/prefill_attn.log | cut -c1-200
RLT_ENGINE_BATCHES=256 RLT_ENGINE_PARTS=early_exit timeout 330 python3 -m perf.bench_engine --quick --out $OUT/engine > $OUT/engine.log 2>&1
tail -n 5 $OUT/engine.log | cut -c1-300; cat $OUT/engine/*.md 2>/dev/null | head -120
