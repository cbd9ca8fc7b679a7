"""Session 27: batch-256 decode of the FP8 benchmark's engines with the device time of every step recorded,
three runs per engine, the third with the cyclic garbage collector paused."""
import gc, json, sys, time
import torch
from rlt_runtime import LLM
from rlt_runtime.entrypoints.bench_offline import decode_benchmark

res = {}
for name, opts in (("bf16", {}), ("w8a8 + KV", {"quantization": "w8a8_fp8", "kv_cache_dtype": "fp8"}),
                   ("w8a8", {"quantization": "w8a8_fp8"})):
    llm = LLM("ouro-1.4b", dtype="bfloat16", max_num_seqs=256, **opts)
    llm.engine.executor.worker.runner.record_device_time = True
    decode_benchmark(llm, 4, 32, 8, prefix="warm")
    for r in range(3):
        gc.collect()
        if r == 2:
            gc.disable()
        out = decode_benchmark(llm, 256, 128, 128, prefix=f"d256r{r}")
        gc.enable()
        row = {k: out.get(k) for k in ("ms_per_step", "tok_per_s", "host_ms_per_step", "device_ms_per_step")}
        row["gc_paused"] = r == 2
        res[f"{name} run{r}"] = row
        print(name, r, {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    json.dump(res, open(sys.argv[1], "w"), indent=1)
