"""Kernel breakdown of steady decode steps per engine config, graphs only at the batches profiled:
    python3 scratch/s46_breakdown.py OUT.json CONFIG... (names of perf.bench_fp8.CONFIGS)"""
import json
import sys
import time

from perf.bench_engine import engine, free_engine, kernel_breakdown
from perf.bench_fp8 import CONFIGS
from rlt_runtime.entrypoints.bench_offline import decode_benchmark

out, res = sys.argv[1], {}
for name in sys.argv[2:]:
    t0 = time.time()
    llm, info = engine("ouro-1.4b", max_num_seqs=256, cuda_graph_sizes=[1, 256], **CONFIGS[name])
    decode_benchmark(llm, 4, 32, 8, prefix="warm")
    res[name] = {"info": info, "build_s": time.time() - t0}
    for b in (256, 1):
        r = kernel_breakdown(llm, b, steps=8, top=24)
        res[name][b] = r
        m = r["marginal"]
        print(f"{name} b{b}: wall {r['wall_ms_per_step']:.2f} ms, kernels {r['kernel_ms_per_step']:.2f} ms, "
              f"{r['kernels_per_step']:.0f} launches, span {m['span_us_per_step']:.0f} us, idle {m['idle_us_per_step']:.0f} us", flush=True)
        for k in m["top"][:22]:
            print(f"   {k['us_per_step']:8.0f} +idle {k['idle_us_per_step']:6.0f}  x{k['calls_per_step']:5.0f}  {k['kernel'][:100]}", flush=True)
        json.dump(res, open(out, "w"), indent=1)
    del llm
    free_engine()
