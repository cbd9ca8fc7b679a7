"""Session 31: decode attention with KVT KV heads per program (1, 2, 4) and key tiles in flight,
bf16 and FP8 caches, the engine's shapes: us per call, fraction of the copy bandwidth, and whether
each variant gives KVT = 1's bits.  python3 s31_kvt.py OUT.json"""
import json, sys, torch
from perf.conftest import cuda_time_ms
from perf import bench_decode_attention as B
from perf.roofline import measure
from rlt_kernels import attention as A

roof = measure()
print(json.dumps(roof), flush=True)
SHAPES = [(1, 192), (16, 192), (64, 192), (128, 192), (256, 192), (256, 512), (64, 1024), (256, 1024), (64, 4096), (16, 32768)]
VARIANTS = {"bf16": [(1, None), (2, None), (4, None), (2, 2), (4, 2)],
            "fp8": [(1, None), (2, None), (4, None), (2, 1), (2, 3), (4, 1)]}
rows = []
for cache in ("bf16", "fp8"):
    for batch, keys in SHAPES:
        c = B.engine_case(batch, keys)
        if cache == "fp8":
            c = B.fp8_case(c)
        base = None
        for kvt, tiles in VARIANTS[cache]:
            A.decode_kv_heads_per_program = lambda *a, _k=kvt: _k  # every unsplit launch, bf16 too
            A.DECODE_TILES_FP8 = tiles or 2
            A.DECODE_TILES = tiles or 1
            out = torch.empty_like(c["q"])
            try:
                ms = cuda_time_ms(B.rlt_call(c, out, 0))
            except Exception as e:  # noqa: BLE001
                print(json.dumps(dict(cache=cache, batch=batch, keys=keys, kvt=kvt, tiles=tiles, error=repr(e)[:300])), flush=True)
                continue
            bits = out.view(torch.int16).clone()
            if base is None:
                base = bits
            nbytes = B.kv_bytes(batch, keys) // (2 if cache == "fp8" else 1)
            row = dict(cache=cache, batch=batch, keys=keys, kvt=kvt, tiles=tiles, us=round(ms * 1e3, 2),
                       frac=round(nbytes / (ms * 1e-3) / 1e9 / roof["copy_gbps"], 3),
                       same_bits=bool(torch.equal(bits, base)))
            rows.append(row)
            print(json.dumps(row), flush=True)
        del c
        torch.cuda.empty_cache()
json.dump({"roofline": roof, "rows": rows}, open(sys.argv[1], "w"), indent=1)
