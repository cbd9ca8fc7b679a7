"""Session 27: W8A8 tiles at 64 and 256 rows (Ouro weights from HBM, one CUDA graph per timing), every
candidate keeping the weight's K ranges (same bits, checked against the default tile's output)."""
import dataclasses, functools, itertools, json, os, sys, time
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import gemm, fp8, fp8_rows

W = [("qkv", 6144, 2048, None), ("o", 2048, 2048, None), ("gate_up", 11264, 2048, "swiglu"), ("down", 2048, 5632, None)]
t0 = time.time()
res = []


def cands(c8, m, k, acc):
    out = []
    if m <= 64:
        for tma, st in itertools.product((False, True), (4, 5, 6)):
            out.append(dataclasses.replace(c8, tma=tma, num_stages=st))
    else:
        for bm, bn, st, ks in itertools.product((64, 128), (64, 128, 256), (3, 4, 5), (c8.block_k,)):
            if acc == 2 and bn == 256:
                continue
            warps = 8 if bm * bn * acc >= 128 * 128 else 4
            for rit in ((False, True) if c8.split_k > 1 else (False,)):
                out.append(dataclasses.replace(c8, block_m=bm, block_n=bn, num_stages=st, num_warps=warps, block_k=ks,
                                               tma=True, reduce_in_tile=rit, swap_ab=False))
    seen, keep = set(), []
    for c in out:
        smem = c.num_stages * (c.block_m + acc * c.block_n) * c.block_k
        if c in seen or c.k_bounds(k) != c8.k_bounds(k) or smem > 227 * 1024:
            continue
        seen.add(c)
        keep.append(c)
    return keep


for name, n, k, act in W:
    acc = 2 if act else 1
    n_out = n // acc
    wb = torch.randn(n, k, device="cuda").mul(k ** -0.5).bfloat16()
    w8, s8 = fp8.quantize_weight_fp8(wb)
    copies = max(2, min(32, (512 << 20) // (n * k)))
    w8s = [w8] + [w8.clone() for _ in range(copies - 1)]
    for m in (64, 256):
        x = torch.randn(m, k, device="cuda").bfloat16()
        xq, xs = fp8_rows.quantize_rows(x)
        out = torch.empty(m, n_out, dtype=torch.bfloat16, device="cuda")
        c8 = gemm.linear_config(n, k, fp8.FP8_DTYPE, act, m)
        ref = gemm._launch(xq, w8, torch.empty_like(out), None, act, c8, s8, x_scale=xs).clone()
        rows = []
        for c in [c8] + [c for c in cands(c8, m, k, acc) if c != c8]:
            if time.time() - t0 > 330:
                break
            try:
                got = gemm._launch(xq, w8, torch.empty_like(out), None, act, c, s8, x_scale=xs)
                torch.cuda.synchronize()
                same = bool(torch.equal(ref.view(torch.int16), got.view(torch.int16)))
                it = itertools.cycle([functools.partial(gemm._launch, xq, w, out, None, act, c, s8, x_scale=xs) for w in w8s])
                us = cuda_time_ms(lambda: next(it)(), iters=40) * 1e3
            except Exception as e:  # noqa: BLE001
                rows.append({"cfg": dataclasses.asdict(c), "error": str(e)[:150]})
                continue
            rows.append({"cfg": dataclasses.asdict(c), "us": us, "same_bits": same, "default": c == c8})
        good = sorted([r for r in rows if "us" in r], key=lambda r: r["us"])
        d = rows[0]
        print(f"{name:8s} M={m:4d} default {d.get('us', 0):7.2f} {d['cfg']} | best:", flush=True)
        for r in good[:3]:
            print(f"      {r['us']:7.2f} bits {r['same_bits']} {r['cfg']}", flush=True)
        print("   any differing bits:", [r["cfg"] for r in rows if r.get("same_bits") is False][:3], flush=True)
        res.append({"weight": name, "m": m, "rows": rows})
    del w8s
    torch.cuda.empty_cache()
json.dump(res, open(sys.argv[1], "w"), indent=1)
print("seconds", time.time() - t0)
