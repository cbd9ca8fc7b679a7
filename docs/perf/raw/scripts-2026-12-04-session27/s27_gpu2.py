"""Session 27, call 2: L2 prefetch with few large pieces per program."""
import json, os, time, traceback
import torch
from perf import bench_decode_chain as bdc

OUT = os.environ.get("OUT", "out")
t0 = time.time()
res = {"rows": []}
V = bdc.VARIANTS[bdc.ENGINE_VARIANT]
for fp8 in (False, True):
    for b in (1, 16):
        chain = bdc.Chain(b, fp8=fp8)
        ref = None
        configs = [("none", "0"), ("self", "1"), ("next", "1"), ("self", "4"), ("next", "4"), ("next", "32")]
        for r in range(2):
            for mode, pieces in configs:
                os.environ["RLT_PF_PIECES"] = pieces
                chain.prefetch = mode
                ms, out = bdc.time_variant(chain, V)
                ref = out if ref is None else ref
                row = {"fp8": fp8, "batch": b, "round": r, "mode": mode, "pieces": pieces, "ms": ms,
                       "same_bits": bool(torch.equal(out, ref))}
                res["rows"].append(row)
                print(row, flush=True)
        del chain
        torch.cuda.empty_cache()
json.dump(res, open(f"{OUT}/s27_gpu2.json", "w"), indent=1)
