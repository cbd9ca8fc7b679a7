"""Fixed-depth decode at a few batches + kernel breakdown (quick check between full runs)."""
import json, os, sys, time
import torch
from perf.bench_engine import engine, floor_ms, kernel_breakdown, _free
from perf.roofline import measure
from rlt_runtime.entrypoints.bench_offline import decode_benchmark, prefill_benchmark
from rlt_runtime.models.presets import preset_config

out = sys.argv[1]
batches = [int(x) for x in sys.argv[2].split(",")]
roof = measure()
cfg = preset_config("ouro-1.4b")
res = {"roofline": roof, "rlt": {}}
llm, meta = engine("ouro-1.4b", max_num_seqs=max(batches))
res["meta"] = meta
print("meta", meta, flush=True)
decode_benchmark(llm, 4, 32, 8, prefix="warm")
for b in batches:
    r = decode_benchmark(llm, b, 128, 128, prefix=f"fixed{b}")
    r["floor_ms"] = floor_ms(cfg, 4, b, roof)
    r["frac_floor"] = r["floor_ms"] / r["ms_per_step"]
    res["rlt"][b] = r
    print("rlt", b, {k: r[k] for k in ("tok_per_s", "ms_per_step", "floor_ms", "frac_floor")}, flush=True)
res["breakdown"] = {} if os.environ.get("NOBD") else {b: kernel_breakdown(llm, b) for b in (batches[0], batches[-1])}
for b, bd in res["breakdown"].items():
    print("breakdown", b, bd["kernels_per_step"], bd["kernel_ms_per_step"])
    for k in bd["top"][:8]:
        print("   ", round(k["us_per_step"]), k["calls_per_step"], k["kernel"][:60])
if os.environ.get("PREFILL"):
    res["prefill"] = prefill_benchmark(llm, 16, 2048)
    print("prefill", res["prefill"], flush=True)
json.dump(res, open(os.path.join(out, "engine_quick.json"), "w"), indent=1, default=str)
if os.environ.get("BASELINE"):
    from perf.torch_baseline import TorchOuroDecode
    from rlt_runtime.models.presets import preset_weights
    del llm
    _free()
    w = dict(preset_weights(cfg, device="cuda", dtype=torch.bfloat16))
    res["baseline"] = {}
    for b in batches:
        base = TorchOuroDecode(cfg, w, b, 256)
        ms = base.step_ms()
        res["baseline"][b] = {"ms_per_step": ms, "tok_per_s": b / ms * 1e3}
        print("baseline", b, res["baseline"][b], "rlt/baseline", res["rlt"][b]["tok_per_s"] / res["baseline"][b]["tok_per_s"], flush=True)
        del base
        _free()
    json.dump(res, open(os.path.join(out, "engine_quick.json"), "w"), indent=1, default=str)
