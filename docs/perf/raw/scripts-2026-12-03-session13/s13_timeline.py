"""Per-kernel marginal time of steady decode steps at small batches (engine, ouro-1.4b)."""
import json, os, sys
import torch
from perf.bench_engine import engine, kernel_breakdown
from rlt_runtime.entrypoints.bench_offline import decode_benchmark
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
llm, meta = engine("ouro-1.4b", max_num_seqs=16)
decode_benchmark(llm, 4, 32, 8, prefix="warm")
res = {"meta": meta}
for b in (1, 16):
    r = decode_benchmark(llm, b, 128, 128, prefix=f"fixed{b}")
    bd = kernel_breakdown(llm, b, steps=8, top=20)
    res[b] = {"bench": r, "breakdown": bd}
    print(b, r["tok_per_s"], r["ms_per_step"], flush=True)
    m = bd["marginal"]
    print(" span", m["span_us_per_step"], "idle", m["idle_us_per_step"])
    for k in m["top"]:
        print(f"  {k['us_per_step']:8.1f} {k['idle_us_per_step']:7.1f} {k['calls_per_step']:6.1f} {k['kernel']}")
json.dump(res, open(f"{out}/timeline.json", "w"), default=str)
