"""Session 27: the FP8 benchmark's decode phase run twice in one engine (a late compile or capture in the
first run would show as a slower first run), batch 256 and 64."""
import gc, json, sys, time
import torch
from rlt_runtime import LLM
from rlt_runtime.entrypoints.bench_offline import decode_benchmark

res = {}
for name, opts in (("w8a8", {"quantization": "w8a8_fp8"}), ("bf16", {}),
                   ("w8a8 + KV", {"quantization": "w8a8_fp8", "kv_cache_dtype": "fp8"})):
    llm = LLM("ouro-1.4b", dtype="bfloat16", max_num_seqs=256, **opts)
    decode_benchmark(llm, 4, 32, 8, prefix="warm")
    for b in (256, 64):
        for r in range(2):
            t = time.time()
            out = decode_benchmark(llm, b, 128, 128, prefix=f"d{b}r{r}")
            row = {k: out[k] for k in ("ms_per_step", "tok_per_s", "host_ms_per_step", "prefill_s", "decode_s")}
            res[f"{name} b{b} run{r}"] = row
            print(name, b, r, {k: round(v, 3) for k, v in row.items()}, round(time.time() - t, 1), flush=True)
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    json.dump(res, open(sys.argv[1], "w"), indent=1)
