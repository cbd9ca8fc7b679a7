"""Session 31: decode launch program order, one KV head's tokens on consecutive programs (old) or
one token's KV heads (heads inner), bf16 and FP8 caches, the engine's shapes: us per call, fraction
of the copy bandwidth, same bits.  python3 s31_order.py OUT.json"""
import json, sys, torch
from perf.conftest import cuda_time_ms
from perf import bench_decode_attention as B
from perf.roofline import measure
from rlt_kernels import attention as A

roof = measure()
print(json.dumps(roof), flush=True)
SHAPES = [(1, 192), (16, 192), (64, 192), (128, 192), (256, 192), (256, 512), (64, 1024), (256, 1024), (64, 4096), (16, 32768)]
rows = []
for cache in ("bf16", "fp8"):
    for batch, keys in SHAPES:
        c = B.engine_case(batch, keys)
        if cache == "fp8":
            c = B.fp8_case(c)
        base = None
        for inner in (False, True, False, True):  # twice each, interleaved
            A.DECODE_HEADS_INNER = inner
            out = torch.empty_like(c["q"])
            ms = cuda_time_ms(B.rlt_call(c, out, 0))
            bits = out.view(torch.int16).clone()
            base = bits if base is None else base
            nbytes = B.kv_bytes(batch, keys) // (2 if cache == "fp8" else 1)
            row = dict(cache=cache, batch=batch, keys=keys, heads_inner=inner, us=round(ms * 1e3, 2),
                       frac=round(nbytes / (ms * 1e-3) / 1e9 / roof["copy_gbps"], 3), same_bits=bool(torch.equal(bits, base)))
            rows.append(row)
            print(json.dumps(row), flush=True)
        del c
        torch.cuda.empty_cache()
A.DECODE_HEADS_INNER = True
json.dump({"roofline": roof, "rows": rows}, open(sys.argv[1], "w"), indent=1)
