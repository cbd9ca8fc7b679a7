# Session 21, call 2: FP8 decode attention sweep (words/bytes x key tiles in flight), then the GPU suite again.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
timeout 150 python3 scratch/s21_fp8_sweep.py $OUT/fp8_decode_sweep.json > $OUT/fp8_decode_sweep.log 2>&1; echo "sweep rc=$?"
python3 -c "
import json; rows=json.load(open('$OUT/fp8_decode_sweep.json'))
for r in rows: print(r['batch'], r['keys'], r['path'], r['tiles'], round(r['us'],1), r['same_bits'])
" 2>&1 | tail -45
timeout 400 python3 -m pytest tests -m gpu -n 8 -q -p no:cacheprovider -rfE --tb=short --durations=10 > $OUT/gpu_tests.log 2>&1
echo "pytest rc=$?" >> $OUT/gpu_tests.log; grep -E "^(FAILED|ERROR)|passed|failed|rc=" $OUT/gpu_tests.log | tail -20
