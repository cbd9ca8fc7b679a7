#!/usr/bin/env bash
# The GPU suite and every benchmark in one call. Results land in $OUT (default ./out).
#   OUT=out bash perf/run_gpu.sh [tests|kernels|engine|spec|serving ...]   (default: all)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.:${PYTHONPATH:-}
parts=${*:-tests kernels engine spec serving}
python3 - <<'PY' | tee "$OUT/env.txt"
import torch, triton, transformers, sys, datetime
print(datetime.date.today(), torch.cuda.get_device_name(0), "torch", torch.__version__, "triton", triton.__version__,
      "transformers", transformers.__version__, "python", sys.version.split()[0], "gpus", torch.cuda.device_count())
PY
for part in $parts; do
  start=$(date +%s)
  case $part in
    tests)   python3 -m pytest tests -m gpu -q -p no:cacheprovider -rfE 2>&1 | tee "$OUT/gpu_tests.log" ;;
    kernels) python3 -m pytest perf -q -p no:cacheprovider --benchmark-json="$OUT/kernels.json" -k "not sweep" \
               2>&1 | tail -n 40 > "$OUT/kernel_bench.log"; python3 -m perf.report_kernels "$OUT/kernels.json" "$OUT" ;;
    engine)  python3 -m perf.bench_engine --out "$OUT" 2>&1 | tee "$OUT/engine.log" ;;
    spec)    [ -f perf/bench_speculative.py ] && python3 -m perf.bench_speculative --out "$OUT" 2>&1 | tee "$OUT/spec.log" ;;
    serving) [ -f perf/bench_serving.py ] && python3 -m perf.bench_serving --out "$OUT" 2>&1 | tee "$OUT/serving.log" ;;
  esac
  echo "== $part: $(( $(date +%s) - start )) s" | tee -a "$OUT/timing.txt"
done
