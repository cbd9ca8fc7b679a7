#!/usr/bin/env bash
# The GPU suite and every benchmark in one call.
#   OUT=out bash perf/run_gpu.sh [tests|kernels|engine|spec|serving ...]   (default: all)
# Each part gets a time limit (PART_TIMEOUT seconds, default 900); every log, JSON, table and plot
# is collected in $OUT/results.tgz (and left unpacked in $WORK). On a bare GPU image, install the
# wheels perf/fetch_gpu_wheels.sh downloads first.
set -u
OUT=${OUT:-out}
WORK=${WORK:-/tmp/rlt-gpu-results}
PART_TIMEOUT=${PART_TIMEOUT:-900}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 PYTHONPATH=.:${PYTHONPATH:-} NCCL_NVLS_ENABLE=0
pack() { tar czf "$OUT/results.tgz" -C "$WORK" . ; }
trap pack EXIT
parts=${*:-tests kernels engine spec serving}
python3 - <<'PY' | tee "$WORK/env.txt"
import torch, triton, transformers, sys, datetime
print(datetime.date.today(), torch.cuda.get_device_name(0), "torch", torch.__version__, "triton", triton.__version__,
      "transformers", transformers.__version__, "python", sys.version.split()[0], "gpus", torch.cuda.device_count())
PY
for part in $parts; do
  start=$(date +%s)
  case $part in
    tests)   # One process per test file, so a device fault in one file cannot take the others down.
             for f in $(grep -l "gpu" tests/*/test_*.py); do
               name=$(basename "$f" .py)
               timeout "$PART_TIMEOUT" python3 -m pytest "$f" -m gpu -v -p no:cacheprovider -rfE --tb=short \
                 > "$WORK/gpu_$name.log" 2>&1
               echo "$name: $(grep -E '^(=+ .*(passed|failed|error).* =+)$' "$WORK/gpu_$name.log" | tail -n 1) rc=$?"
             done | tee "$WORK/gpu_tests_summary.txt" ;;
    kernels) timeout "$PART_TIMEOUT" python3 -m pytest perf -q -p no:cacheprovider --benchmark-json="$WORK/kernels.json" \
               -k "not sweep" > "$WORK/kernel_bench.log" 2>&1; tail -n 15 "$WORK/kernel_bench.log"
             python3 -m perf.report_kernels "$WORK/kernels.json" "$WORK" ;;
    engine)  timeout "$PART_TIMEOUT" python3 -m perf.bench_engine --out "$WORK" ${QUICK:+--quick} > "$WORK/engine.log" 2>&1
             tail -n 25 "$WORK/engine.log" ;;
    spec)    timeout "$PART_TIMEOUT" python3 -m perf.bench_speculative --out "$WORK" ${QUICK:+--quick} > "$WORK/spec.log" 2>&1
             tail -n 15 "$WORK/spec.log" ;;
    serving) timeout "$PART_TIMEOUT" python3 -m perf.bench_serving --out "$WORK" ${QUICK:+--quick} > "$WORK/serving.log" 2>&1
             tail -n 15 "$WORK/serving.log" ;;
  esac
  echo "== $part: $(( $(date +%s) - start )) s" | tee -a "$WORK/timing.txt"
done
