"""W8A8 down (FP8 rows and weights, 4 K ranges of 1,536) at prefill rows over TMA tiles; bits vs the tile in use."""
import itertools, json, sys
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import gemm
from rlt_kernels.fp8 import FP8_DTYPE, quantize_weight_fp8
from rlt_kernels.fp8_rows import quantize_rows

res = {}
n, k = 2048, 5632
plan = gemm.linear_config(n, k, FP8_DTYPE, None, None, FP8_DTYPE)
ws = [quantize_weight_fp8(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5) for _ in range(8)]
for m in (1024, 2048, 4096):
    x, xs = quantize_rows(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    in_use = gemm.linear_config(n, k, FP8_DTYPE, None, m, FP8_DTYPE)
    call = lambda cfg, i, o=None: gemm._launch(x, ws[i % 8][0], out if o is None else o, None, None, cfg, ws[i % 8][1], x_scale=xs)
    ref = call(in_use, 0, torch.empty_like(out)).view(torch.int16)
    it = itertools.count()
    rows = {"in_use": str(in_use)}
    for (bm, bn, w), bk, st in itertools.product(((128, 128, 8), (64, 256, 8), (128, 64, 4), (64, 128, 4), (128, 256, 8)), (256, 512), (2, 3, 4, 5)):
        if st * (bm + bn) * bk > 225 * 1024:
            continue
        cfg = gemm.LinearConfig(bm, bn, bk, w, st, split_k=plan.split_k, tma=True, reduce_in_tile=True)
        if cfg.k_bounds(k) != plan.k_bounds(k):
            continue
        try:
            t = cuda_time_ms(lambda c=cfg: call(c, next(it)), iters=20) * 1e3
            rows[f"{bm}x{bn}x{bk} w{w} s{st}"] = {"us": round(t, 2), "same_bits": bool(torch.equal(call(cfg, 0, torch.empty_like(out)).view(torch.int16), ref))}
        except Exception as exc:
            rows[f"{bm}x{bn}x{bk} w{w} s{st}"] = {"error": str(exc)[:100]}
    good = sorted(((l, r) for l, r in rows.items() if isinstance(r, dict) and "us" in r), key=lambda kv: kv[1]["us"])
    print("w8a8 down", m, in_use, good[:6], "all same bits", all(r["same_bits"] for _, r in good), flush=True)
    res[m] = rows
json.dump(res, open(sys.argv[1], "w"), indent=1)
