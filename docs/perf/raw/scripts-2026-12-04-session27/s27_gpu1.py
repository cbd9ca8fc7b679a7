"""Session 27, call 1: L2 prefetch of weights in the decode chain (none / own weight / next linear's weight)."""
import json, os, time, traceback
import torch
from perf import bench_decode_chain as bdc
from perf.roofline import measure

OUT = os.environ.get("OUT", "out")
t0 = time.time()
roof = measure()
res = {"roofline": roof, "rows": []}
print(roof, flush=True)
V = bdc.VARIANTS[bdc.ENGINE_VARIANT]
for fp8 in (False, True):
    floor = bdc.weight_bytes(fp8) / (roof["copy_gbps"] * 1e9) * 1e3
    for b in (1, 16, 64, 256):
        if time.time() - t0 > 420:
            break
        chain = bdc.Chain(b, fp8=fp8)
        ref = None
        configs = [("none", None), ("self", None), ("next", None), ("next", (24 if not fp8 else 12) << 20)]
        for r in range(2):
            for mode, cap in configs:
                chain.prefetch, chain.prefetch_cap = mode, cap
                try:
                    ms, out = bdc.time_variant(chain, V)
                except Exception as e:
                    traceback.print_exc()
                    res["rows"].append({"fp8": fp8, "batch": b, "mode": mode, "cap": cap, "error": repr(e)[:500]})
                    continue
                ref = out if ref is None else ref
                row = {"fp8": fp8, "batch": b, "round": r, "mode": mode, "cap": cap, "ms": ms, "of_floor": floor / ms,
                       "same_bits": bool(torch.equal(out, ref)), "t": time.time() - t0}
                res["rows"].append(row)
                print(row, flush=True)
        del chain
        torch.cuda.empty_cache()
        json.dump(res, open(f"{OUT}/s27_gpu1.json", "w"), indent=1)
res["seconds"] = time.time() - t0
json.dump(res, open(f"{OUT}/s27_gpu1.json", "w"), indent=1)
