"""Session 12, call 2: K ranges added inside TMA tiles, one pipelined loop (flat) against one loop per
range (static), against the unsplit weight (old rule): o at M = 64 / 256 / 2048, down at 2048."""
import json, sys
import torch
from rlt_kernels import gemm
from perf.conftest import cuda_time_ms
from perf.roofline import measure

res = {"roofline": measure()}
g = torch.Generator(device="cuda").manual_seed(0)
orig_min = gemm.WAVE_SPLIT_MIN_STEPS
for name, (n, k) in {"o": (2048, 2048), "down": (2048, 5632)}.items():
    copies = max(4, int(400e6 // (n * k * 2)))
    ws = [torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16) * k**-0.5 for _ in range(copies)]
    for rows in (64, 128, 256, 512, 1024, 2048, 4096):
        x = torch.randn(rows, k, device="cuda", generator=g).to(torch.bfloat16)
        r, bits = {}, {}
        for rule in ("old", "static", "flat"):
            gemm.WAVE_SPLIT_MIN_STEPS = 10**9 if rule == "old" else orig_min
            gemm.TMA_FLAT_RANGES = rule != "static"
            gemm.linear_config.cache_clear()
            cfg = gemm.linear_config(n, k, torch.bfloat16, None, rows)
            fn = lambda: [gemm.linear(x, w) for w in ws]
            ms = cuda_time_ms(fn, reps=2)
            bits[rule] = gemm.linear(x, ws[0])
            r[rule] = {"us": ms * 1e3 / copies, "cfg": str(cfg)}
        one = gemm.linear(x[:1].contiguous(), ws[0])
        r["flat_equals_static"] = bool(torch.equal(bits["flat"], bits["static"]))
        r["flat_row0_equals_one_row"] = bool(torch.equal(bits["flat"][:1], one))
        res[f"{name}_M{rows}"] = r
        print(name, rows, {k2: (round(v["us"], 2) if isinstance(v, dict) else v) for k2, v in r.items()}, flush=True)
    del ws
    torch.cuda.empty_cache()
gemm.WAVE_SPLIT_MIN_STEPS = orig_min
gemm.TMA_FLAT_RANGES = True
gemm.linear_config.cache_clear()
json.dump(res, open(sys.argv[1], "w"), indent=1)
