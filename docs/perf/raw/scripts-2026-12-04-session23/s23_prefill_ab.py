"""Engine prefill (8 prompts x 2,048 tokens, Ouro-1.4B replica, bf16) with the prefill tiles of split
weights as before ("old": 128 x 128 x 64, 3 stages) or as now ("new"); the compute floor from the
same process's GEMM rate."""
import json, sys, time
import torch
from rlt_kernels import gemm

mode, out = sys.argv[1], sys.argv[2]
quant = sys.argv[3] if len(sys.argv) > 3 else None
if mode == "old":
    gemm.TMA_PREFILL_IN_TILE_TILES = {2: ((128, 128, 64, 8, 3),), 1: ((128, 128, 64, 8, 3),)}
from perf.roofline import measure
from perf.bench_engine import engine, weight_bytes_per_step, prefill_breakdown
from rlt_runtime.entrypoints.bench_offline import prefill_benchmark
from rlt_runtime.models.presets import preset_config

roof = measure()
cfg = preset_config("ouro-1.4b")
kw = {"max_num_seqs": 16}
if quant:
    kw["quantization"] = quant
llm, meta = engine("ouro-1.4b", **kw)
flops_tok = weight_bytes_per_step(cfg, 4)
res = {"mode": mode, "quantization": quant, "roofline": roof, "meta": meta, "runs": [],
       "down_tile": str(gemm.linear_config(2048, 5632, torch.bfloat16, None, 4096))}
for i in range(3):
    r = prefill_benchmark(llm, 8, 2048, seed=1 + i)
    r["frac_compute_floor"] = r["tok_per_s"] * flops_tok / (roof["gemm_tflops"] * 1e12)
    res["runs"].append(r)
    print(mode, quant, r, flush=True)
pb = prefill_breakdown(llm, 4, 2048)
res["breakdown"] = {k: pb[k] for k in ("tokens_per_step", "wall_ms_per_step", "kernel_ms_per_step")}
res["breakdown"]["top"] = pb["top"][:4]
print(mode, quant, res["breakdown"], flush=True)
json.dump(res, open(out, "w"), indent=1)
