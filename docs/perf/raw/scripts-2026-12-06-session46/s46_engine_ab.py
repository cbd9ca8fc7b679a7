"""W8A8 + FP8 K/V engine at BATCHES (default 256; graphs of those rows only), FP8 decode attention variants alternating:
    python3 scratch/s46_engine_ab.py OUT.json main w1c0 main w1c0 ...   (wWcC: W warps, register cap C, 0: none)"""
import json
import os
import sys

from perf.bench_engine import engine, free_engine
from rlt_kernels import attention
from rlt_runtime.entrypoints.bench_offline import decode_benchmark

MAIN = (attention.DECODE_WARPS_FP8, attention.DECODE_FP8_MAX_REGISTERS, attention.DECODE_FP8_CAP_FROM_PROGRAMS_PER_SM)


def use(spec):
    if spec == "main":
        v = MAIN
    else:
        w, c = spec[1:].split("c")
        v = (int(w), int(c), 0) if int(c) else (int(w), 255, 10**9)
    attention.DECODE_WARPS_FP8, attention.DECODE_FP8_MAX_REGISTERS, attention.DECODE_FP8_CAP_FROM_PROGRAMS_PER_SM = v


out, res = sys.argv[1], []
batches = [int(b) for b in os.environ.get("BATCHES", "256").split(",")]
for i, spec in enumerate(sys.argv[2:]):
    use(spec)
    llm, info = engine("ouro-1.4b", max_num_seqs=max(batches), cuda_graph_sizes=batches, quantization="w8a8_fp8",
                       kv_cache_dtype="fp8")
    decode_benchmark(llm, min(4, max(batches)), 32, 8, prefix="warm")
    for batch in batches:
        runs = [decode_benchmark(llm, batch, 128, 128, prefix=f"r{i}{j}b{batch}", seed=j) for j in range(2)]
        row = {"variant": spec, "batch": batch, "ms_per_step": [r["ms_per_step"] for r in runs],
               "device_ms_per_step": [r.get("device_ms_per_step") for r in runs]}
        res.append(row)
        print(row, flush=True)
    json.dump(res, open(out, "w"), indent=1)
    del llm
    free_engine()
