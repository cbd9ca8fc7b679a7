"""Session 15, call 2: fused RoPE decode attention in the chain at batch 64 and 256 (A/B)."""
import json, os, sys
import torch
from perf import bench_decode_chain as bdc
out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
res = {}
for b in (256, 64):
    ch = bdc.Chain(b)
    ref_out = None
    for variant in ("dependent launches + in-place merge", bdc.ENGINE_VARIANT) * 2:
        ms, o = bdc.time_variant(ch, bdc.VARIANTS[variant])
        ref_out = o if ref_out is None else ref_out
        res.setdefault(str(b), []).append(dict(variant=variant, ms=ms, same_bits=bool(torch.equal(o, ref_out))))
        print("chain", b, res[str(b)][-1], flush=True)
    del ch
    torch.cuda.empty_cache()
json.dump(res, open(os.path.join(out_dir, "s15_chain_ab.json"), "w"), indent=1)
