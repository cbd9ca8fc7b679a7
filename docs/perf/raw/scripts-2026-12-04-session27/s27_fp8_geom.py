"""Session 27: FP8 decode attention geometries (key lanes, warps, key tiles in flight) at engine shapes."""
import json, sys, time, torch
from perf.conftest import cuda_time_ms
from perf import bench_decode_attention as B
from perf.roofline import measure
from rlt_kernels import attention

t0 = time.time()
roof = measure()
rows = []
cases = [(1, 192), (64, 192), (256, 192), (256, 1024)]
inputs = {case: B.fp8_case(B.engine_case(*case)) for case in cases}
default = (attention.DECODE_LANE_ELEMENTS, attention.DECODE_WARPS, attention.DECODE_TILES_FP8)
variants = [default] + [(lanes, warps, tiles) for lanes in (16, 32) for warps in (4, 8) for tiles in (1, 2, 3, 4)
                        if (lanes, warps, tiles) != default]
ref = {}
for lanes, warps, tiles in variants:
    if time.time() - t0 > 170:
        break
    attention.DECODE_LANE_ELEMENTS, attention.DECODE_WARPS, attention.DECODE_TILES_FP8 = lanes, warps, tiles
    for (batch, keys), c in inputs.items():
        out = torch.empty_like(c["q"])
        try:
            ms = cuda_time_ms(B.rlt_call(c, out, 0))
        except Exception as exc:
            rows.append(dict(lanes=lanes, warps=warps, tiles=tiles, batch=batch, keys=keys, error=str(exc)[:200]))
            continue
        bits = out.view(torch.int16).clone()
        key = (lanes, batch, keys)
        ref.setdefault(key, bits)
        rows.append(dict(lanes=lanes, warps=warps, tiles=tiles, batch=batch, keys=keys, us=ms * 1e3,
                         frac=B.kv_bytes(batch, keys) / 2 / (ms * 1e-3) / 1e9 / roof["copy_gbps"],
                         same_bits_within_lanes=bool(torch.equal(bits, ref[key]))))
        print(json.dumps(rows[-1]), flush=True)
json.dump({"roofline": roof, "rows": rows}, open(sys.argv[1], "w"), indent=1)
