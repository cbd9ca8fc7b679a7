"""Session 31: batch-256 kernel breakdown (torch.profiler, steady decode steps) of the bf16 and the
W8A8 + FP8 K/V engines, heaps frozen as the benchmarks build them."""
import json, sys
from perf.bench_engine import engine, free_engine, kernel_breakdown

res = {}
for name, kw in [("w8a8 + KV", {"quantization": "w8a8_fp8", "kv_cache_dtype": "fp8"}), ("bf16", {})]:
    llm, info = engine("ouro-1.4b", max_num_seqs=256, **kw)
    res[name] = dict(kernel_breakdown(llm, 256), **info)
    print(name, {k: v for k, v in res[name].items() if k != "top"}, flush=True)
    for row in res[name]["top"][:8]:
        print("   ", row, flush=True)
    del llm
    free_engine()
    json.dump(res, open(sys.argv[1], "w"), indent=1)
json.dump(res, open(sys.argv[1], "w"), indent=1)
