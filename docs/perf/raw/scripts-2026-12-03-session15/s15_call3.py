"""Session 15, call 3: first weight step loaded before the wait (PRELOAD) in the decode chain."""
import json, os, sys
import torch
from perf import bench_decode_chain as bdc
from rlt_kernels import gemm
out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
res = {}
for b in (1, 4, 16, 64):
    ch = bdc.Chain(b)
    ref_out = None
    for pre in (False, True, False, True):
        gemm.PRELOAD_WEIGHTS = pre
        ms, o = bdc.time_variant(ch, bdc.VARIANTS[bdc.ENGINE_VARIANT])
        ref_out = o if ref_out is None else ref_out
        res.setdefault(str(b), []).append(dict(preload=pre, ms=ms, same_bits=bool(torch.equal(o, ref_out))))
        print("chain", b, res[str(b)][-1], flush=True)
    del ch
    torch.cuda.empty_cache()
gemm.PRELOAD_WEIGHTS = True
json.dump(res, open(os.path.join(out_dir, "s15_preload.json"), "w"), indent=1)
