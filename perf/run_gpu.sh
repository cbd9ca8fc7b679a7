#!/usr/bin/env bash
# The GPU suite and every benchmark in one call.
#   OUT=out bash perf/run_gpu.sh [tests|validate|rest|device-tests|conformance|kernels|decode-attn|chain|gemm-sweep|attn-sweep|engine|gaps|compile|spec|serving|fp8 ...]
#   (default: all but the sweeps; `tests` runs the GPU pytest suite and the conformance matrix side by
#   side on the device, each with its own time limit, PART_TIMEOUT and CONF_TIMEOUT (default 480 s), so
#   both fit one device call; `validate` runs the same two one after the other; `rest`, with REST_FROM naming an
#   earlier validate call's $WORK, what that call left unfinished; `device-tests` the kernel tests that take the `device`
#   fixture and carry no gpu marker, which `tests` leaves out). Narrowing a part: TESTS_K (pytest -k for the GPU tests),
#   CONF_CASES, CONF_SEED, CONF_WORKERS, CONF_BUDGET, CONF_ONLY, CONF_FIRST (the conformance matrix: perf/conformance.py),
#   RLT_SWEEP_K (weights and sweeps of gemm-sweep, e.g. "skinny and ouro.o" for the transposed decode tiles), RLT_SPEC_CONFIGS (fixed2,fixed4,adaptive), RLT_SPEC_BATCHES,
#   RLT_SPEC_ACCEPTANCE (measured,0.7,0.9),
#   RLT_SERVING_MODES (native,speculative), RLT_SERVING_RATES (request rates, e.g. 16,32,inf),
#   RLT_FP8_PARTS (fp8: "speed fidelity" by default; "fidelity" alone measures KL and agreement only),
#   RLT_CHAIN_ARGS (chain: e.g. "--fp8 --ablate" for FP8 weights, kernel by kernel; "--batches 256 --live 256,160,96"
#   for the kernels of a batch-256 graph with fewer live rows, as in early-exit steps).
# Each part gets a time limit (PART_TIMEOUT seconds, default 900); every log, JSON, table and plot
# is collected in $OUT/results.tgz (and left unpacked in $WORK). On a bare GPU image, install the
# wheels perf/fetch_gpu_wheels.sh downloads first.
set -u
OUT=${OUT:-out}
WORK=${WORK:-/tmp/rlt-gpu-results}
PART_TIMEOUT=${PART_TIMEOUT:-900}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 PYTHONPATH=.:${PYTHONPATH:-} NCCL_NVLS_ENABLE=0
CONF_TIMEOUT=${CONF_TIMEOUT:-480}
pack() { tar czf "$OUT/results.tgz" -C "$WORK" . ; }
conformance() {  # Random engine configurations, each case in its own process, bitwise against its requests
                 # run alone (docs/gpu_validation.md); the runner keeps to CONF_BUDGET, timeout is the backstop.
                 # Arguments: more perf.conformance options (e.g. --only "c031 ").
  timeout "$CONF_TIMEOUT" python3 -m perf.conformance --out "$WORK/conformance" --cases "${CONF_CASES:-40}" \
    --seed "${CONF_SEED:-0}" --workers "${CONF_WORKERS:-6}" --budget-s "${CONF_BUDGET:-420}" ${CONF_ONLY:+--only "$CONF_ONLY"} ${CONF_FIRST:+--first "$CONF_FIRST"} \
    "$@" > "$WORK/conformance.log" 2>&1
  echo "conformance exit code $?" | tee -a "$WORK/conformance.log"
  grep -E -A1 "^ *(fail|crash|timeout) " "$WORK/conformance.log"; grep "^conformance:" "$WORK/conformance.log"
}
gpu_tests() {  # Every GPU test (or the node ids given as arguments), spread over pytest-xdist workers sharing
               # the device (a device fault takes down one worker, which is replaced; its test is reported as failed).
               # At PART_TIMEOUT pytest gets SIGINT, so it still prints the failures so far with their tracebacks
               # (SIGKILL 30 s later if it has not stopped).
  local targets=("$@")
  [ ${#targets[@]} -eq 0 ] && targets=(tests)
  timeout -s INT -k 30 "$PART_TIMEOUT" python3 -m pytest "${targets[@]}" -m gpu -n "${WORKERS:-6}" -v -p no:cacheprovider -rfE ${TESTS_K:+-k "$TESTS_K"} \
    --tb=short --junitxml="$WORK/gpu_tests.xml" > "$WORK/gpu_tests.log" 2>&1
}
gpu_tests_summary() {
  grep -E "^(FAILED|ERROR)|^=+ .*(passed|failed|error).* =+$" "$WORK/gpu_tests.log" | tee "$WORK/gpu_tests_summary.txt"
}
trap pack EXIT
parts=${*:-tests kernels decode-attn engine compile spec serving}
python3 - <<'PY' | tee "$WORK/env.txt"
import torch, triton, transformers, sys, datetime
print(datetime.date.today(), torch.cuda.get_device_name(0), "torch", torch.__version__, "triton", triton.__version__,
      "transformers", transformers.__version__, "python", sys.version.split()[0], "gpus", torch.cuda.device_count())
PY
for part in $parts; do
  start=$(date +%s)
  case $part in
    tests)   # Every GPU test beside the conformance matrix.
             gpu_tests &
             tests_pid=$!
             conformance
             wait "$tests_pid"
             gpu_tests_summary ;;
    validate)  # The same two, one after the other: the GPU tests first, then the matrix on the Triton
             # cache they filled (case processes that start together on a cold cache all compile the
             # same kernels; on a warm cache the 72 cases once ran in 141 s, docs/gpu_validation.md).
             gpu_tests
             gpu_tests_summary
             conformance ;;
    rest)    # What an earlier validate call left unfinished (REST_FROM: that call's $WORK, carried along; same
             # CONF_CASES and CONF_SEED): its GPU tests with no result beside its matrix cases that did not
             # run (perf/validation_rest.py).
             mapfile -t rest_tests < <(python3 -m perf.validation_rest "$REST_FROM" --tests)
             mapfile -t rest_cases < <(python3 -m perf.validation_rest "$REST_FROM" --cases)
             echo "rest: ${#rest_tests[@]} GPU tests, ${#rest_cases[@]} matrix cases" | tee "$WORK/rest.txt"
             only=()
             for case in "${rest_cases[@]}"; do only+=(--only "$case"); done
             tests_pid=
             if [ ${#rest_tests[@]} -gt 0 ]; then gpu_tests "${rest_tests[@]}" & tests_pid=$!; fi
             [ ${#only[@]} -gt 0 ] && conformance "${only[@]}"
             if [ -n "$tests_pid" ]; then wait "$tests_pid"; gpu_tests_summary; fi ;;
    device-tests)  # The kernel tests that take the `device` fixture and carry no gpu marker (the CPU suite's
                   # kernel checks, bitwise invariances and fp32 among them) on the GPU, on pytest-xdist workers.
             timeout -s INT -k 30 "$PART_TIMEOUT" python3 -m pytest tests --device-kernel-tests -n "${WORKERS:-6}" -v \
               -p no:cacheprovider -rfE ${TESTS_K:+-k "$TESTS_K"} --tb=short --junitxml="$WORK/device_tests.xml" > "$WORK/device_tests.log" 2>&1
             grep -E "^(FAILED|ERROR)|^=+ .*(passed|failed|error).* =+$" "$WORK/device_tests.log" \
               | tee "$WORK/device_tests_summary.txt" ;;
    conformance) conformance ;;
    kernels) timeout "$PART_TIMEOUT" python3 -m pytest perf -q -p no:cacheprovider --benchmark-json="$WORK/kernels.json" \
               -k "not sweep" > "$WORK/kernel_bench.log" 2>&1; tail -n 15 "$WORK/kernel_bench.log"
             python3 -m perf.report_kernels "$WORK/kernels.json" "$WORK" ;;
    gemm-sweep)  # Tile-config sweep of the decode GEMMs (RLT_SWEEP_K picks the weights).
             RLT_GEMM_SWEEP=1 timeout "$PART_TIMEOUT" python3 -m pytest perf/test_bench_gemm.py -q -s -p no:cacheprovider \
               -k "sweep and (${RLT_SWEEP_K:-ouro.o or ouro.down})" --benchmark-json="$WORK/gemm_sweep.json" > "$WORK/gemm_sweep.log" 2>&1
             grep -A7 "chosen" "$WORK/gemm_sweep.log" ;;
    attn-sweep)  # Attention tile rows at engine-like decode shapes and 2K prefill, with bit checks.
             RLT_ATTN_SWEEP=1 timeout "$PART_TIMEOUT" python3 -m pytest perf/test_bench_attention.py -q -s -p no:cacheprovider \
               -k sweep --benchmark-json="$WORK/attn_sweep.json" > "$WORK/attn_sweep.log" 2>&1
             grep -E "^(decode|prefill)|passed|failed|Error" "$WORK/attn_sweep.log" ;;
    decode-attn)  # Decode attention at engine shapes beside cuDNN/FA2 SDPA and cuDNN's paged SDPA (RLT_DECODE_SWEEP=1: geometry
                  # sweep; RLT_DECODE_LIMITS=4096,65536: every case with tables of each width).
             timeout "$PART_TIMEOUT" python3 -m perf.bench_decode_attention --out "$WORK" ${RLT_DECODE_SWEEP:+--sweep} \
               ${RLT_DECODE_LIMITS:+--context-limits "$RLT_DECODE_LIMITS"} \
               > "$WORK/decode_attention.log" 2>&1; tail -n 24 "$WORK/decode_attention.log" ;;
    chain)   # A decode step's layer-loops as one graph, launch variants against the weight floor (perf/bench_decode_chain.py).
             timeout "$PART_TIMEOUT" python3 -m perf.bench_decode_chain --out "$WORK/chain" ${RLT_CHAIN_ARGS:-} > "$WORK/chain.log" 2>&1
             grep "^batch" "$WORK/chain.log" ;;
    engine)  timeout "$PART_TIMEOUT" python3 -m perf.bench_engine --out "$WORK" ${QUICK:+--quick} > "$WORK/engine.log" 2>&1
             tail -n 25 "$WORK/engine.log" ;;
    gaps)    # Per-step wall / host / device times, collections and idle gaps at batch 256 (perf/step_gaps.py).
             timeout "$PART_TIMEOUT" python3 -m perf.step_gaps --out "$WORK/gaps" > "$WORK/gaps.log" 2>&1
             tail -n 4 "$WORK/gaps.log" ;;
    compile) timeout "$PART_TIMEOUT" python3 -m perf.bench_compile --out "$WORK" ${QUICK:+--quick} > "$WORK/compile.log" 2>&1
             tail -n 8 "$WORK/compile.log" ;;
    spec)    timeout "$PART_TIMEOUT" python3 -m perf.bench_speculative --out "$WORK" ${QUICK:+--quick} > "$WORK/spec.log" 2>&1
             tail -n 15 "$WORK/spec.log" ;;
    fp8)     # FP8 weights / weights + K/V against bf16 on ouro-1.4b: speed and fidelity (perf/bench_fp8.py).
             timeout "$PART_TIMEOUT" python3 -m perf.bench_fp8 --out "$WORK/fp8" --parts ${RLT_FP8_PARTS:-speed fidelity} \
               > "$WORK/fp8.log" 2>&1; tail -n 20 "$WORK/fp8.log" ;;
    serving) timeout "$PART_TIMEOUT" python3 -m perf.bench_serving --out "$WORK" ${QUICK:+--quick} > "$WORK/serving.log" 2>&1
             tail -n 15 "$WORK/serving.log" ;;
  esac
  echo "== $part: $(( $(date +%s) - start )) s" | tee -a "$WORK/timing.txt"
done
