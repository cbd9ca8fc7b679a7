"""Session 27: where the W8A8 engines' decode steps go, kernel by kernel, against bf16 (batch 1 and 256)."""
import gc, json, sys, time
import torch
from perf.bench_engine import kernel_breakdown
from rlt_runtime import LLM

t0 = time.time()
res = {}
for name, opts, batches in (("w8a8", {"quantization": "w8a8_fp8"}, (256, 1)),
                            ("w8a8 + KV", {"quantization": "w8a8_fp8", "kv_cache_dtype": "fp8"}, (256,))):
    llm = LLM("ouro-1.4b", dtype="bfloat16", max_num_seqs=256, **opts)
    for b in batches:
        r = kernel_breakdown(llm, b, steps=6, top=40)
        res[f"{name} b{b}"] = r
        mg = r["marginal"]
        print(f"== {name} batch {b}: wall {r['wall_ms_per_step']:.3f} ms, kernels {r['kernel_ms_per_step']:.3f} ms, "
              f"span {mg['span_us_per_step']:.0f} us, idle {mg['idle_us_per_step']:.0f}", flush=True)
        for k in mg["top"][:22]:
            print(f"  {k['us_per_step']:8.1f} us  idle {k['idle_us_per_step']:6.1f}  x{k['calls_per_step']:5.0f}  {k['kernel'][:80]}", flush=True)
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    json.dump(res, open(sys.argv[1], "w"), indent=1)
print("seconds", time.time() - t0)
