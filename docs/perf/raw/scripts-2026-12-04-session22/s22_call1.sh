# Session 22, call 1: FP8 row classes at the tiny presets' shapes; c018 reproduced side by side.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 150 python3 -m pytest tests/kernels/test_fp8_linear.py -m gpu -n 8 -q -p no:cacheprovider -rfE --tb=short > $OUT/fp8_rows.log 2>&1
echo "fp8 row tests rc=$?" >> $OUT/fp8_rows.log; tail -8 $OUT/fp8_rows.log
bash scratch/c018_stress.sh
