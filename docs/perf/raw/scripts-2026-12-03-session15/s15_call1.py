"""Session 15, call 1: decode attention key tiles in flight (1..4) at small batches; decode chain."""
import json, os, sys, time
import torch
from perf import bench_decode_attention as bda, bench_decode_chain as bdc
from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
res = {"roofline": measure()}
roof = res["roofline"]
cases = [(1, 192), (1, 320), (2, 192), (4, 192), (8, 192), (1, 1024), (8, 1024), (1, 4096), (16, 192), (64, 192), (256, 192)]
inputs = {c: bda.engine_case(*c) for c in cases}
rows, ref = [], {}
for tiles in (2, 1, 3, 4):
    attention.DECODE_TILES = attention.DECODE_TILES_SMALL_LAUNCH = tiles
    for (b, keys), c in inputs.items():
        o = torch.empty_like(c["q"])
        try:
            ms = cuda_time_ms(bda.rlt_call(c, o, 0))
        except Exception as e:
            rows.append(dict(tiles=tiles, batch=b, keys=keys, error=str(e)[:300])); print(rows[-1], flush=True); continue
        bits = o.view(torch.int16).clone()
        ref.setdefault((b, keys), bits)
        rows.append(dict(tiles=tiles, batch=b, keys=keys, us=ms * 1e3,
                         frac=bda.kv_bytes(b, keys) / (ms * 1e-3) / 1e9 / roof["copy_gbps"],
                         same_bits=bool(torch.equal(bits, ref[(b, keys)]))))
        print(rows[-1], flush=True)
res["attention_tiles"] = rows
attention.DECODE_TILES, attention.DECODE_TILES_SMALL_LAUNCH = 1, 2
del inputs
torch.cuda.empty_cache()
chain = {}
for b in (1, 4, 16, 64):
    ch = bdc.Chain(b)
    ref_out = None
    for tiles, variant in ((2, "dependent launches + in-place merge"), (4, "dependent launches + in-place merge"),
                           (2, bdc.ENGINE_VARIANT), (4, bdc.ENGINE_VARIANT), (3, bdc.ENGINE_VARIANT),
                           (2, "dependent launches + in-place merge"), (4, bdc.ENGINE_VARIANT)):
        if b > 8 and tiles != 2:
            continue
        attention.DECODE_TILES_SMALL_LAUNCH = tiles
        ms, o = bdc.time_variant(ch, bdc.VARIANTS[variant])
        ref_out = o if ref_out is None else ref_out
        chain.setdefault(str(b), []).append(dict(tiles=tiles, variant=variant, ms=ms,
                                                 same_bits=bool(torch.equal(o, ref_out))))
        print("chain", b, chain[str(b)][-1], flush=True)
    del ch
    torch.cuda.empty_cache()
attention.DECODE_TILES_SMALL_LAUNCH = 2
res["chain"] = chain
json.dump(res, open(os.path.join(out_dir, "s15_call1.json"), "w"), indent=1)
for t in (2, 4):
    attention.DECODE_TILES_SMALL_LAUNCH = t
    res[f"ablation_tiles{t}"] = bdc.ablate([1])
json.dump(res, open(os.path.join(out_dir, "s15_call1.json"), "w"), indent=1)
