# Library comparisons: FP8 decode attention vs FlashInfer, FP8 linears vs cuBLASLt.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
tar -xzf scratch/fi/flashinfer-trimmed.tgz -C /tmp/site
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=/tmp/fiws
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import flashinfer, torch, triton; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tail -2
timeout 130 python3 -m perf.bench_decode_attention --out $OUT/da --no-key-depth \
  --cases 256x192,64x192 > $OUT/da.log 2>&1
echo "da rc=$?"; tail -14 $OUT/da.log
timeout 170 python3 -m pytest -q -p no:cacheprovider perf/test_bench_gemm.py -k "fp8 and ouro and not M2048 and not M4 and not M16 and not M64" \
  --benchmark-json=$OUT/gemm_fp8.json > $OUT/gemm.log 2>&1
echo "gemm rc=$?"; tail -3 $OUT/gemm.log
python3 - <<'PY'
import json, os
p = os.path.join(os.environ["OUT"], "gemm_fp8.json")
if os.path.exists(p):
    for b in json.load(open(p))["benchmarks"]:
        e = b["extra_info"]
        print(f"{e['name']:40s} {e['ms']*1e3:8.1f}us lib {e['library_ms']*1e3:8.1f} (rows {e['library_rows']}) "
              f"bf16 {e['bf16_layer_ms']*1e3:8.1f} frac_w {e['frac_bandwidth_weights']:.2f} vs_lib {e['vs_library']:.2f} diff {e['max_abs_diff_vs_library']:.3g}")
PY
