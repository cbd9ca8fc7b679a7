"""Session 23, call 2: stages of the TMA tiles whose weights add their K ranges in the tile (Ouro down
and o; bf16, FP8 weights, W8A8), middle and prefill rows. Bits compared with the tile in use."""
import json, sys, time, itertools
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import gemm
from rlt_kernels.fp8 import FP8_DTYPE, quantize_weight_fp8
from rlt_kernels.fp8_rows import quantize_rows

OUT = sys.argv[1]
res = {}
SMEM = 227 * 1024

def run():
    for kind in ("bf16", "w8a8", "fp8"):
        for name, n, k in (("down", 2048, 5632), ("o", 2048, 2048)):
            xdt = FP8_DTYPE if kind == "w8a8" else torch.bfloat16
            wdt = None if kind == "bf16" else FP8_DTYPE
            plan = gemm.linear_config(n, k, xdt, None, None, wdt)
            copies = 8
            wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(copies)]
            if kind == "bf16":
                ws = [(w, None) for w in wb]
            else:
                ws = [quantize_weight_fp8(w) for w in wb]
            for m in (256, 512, 1024, 2048, 4096):
                in_use = gemm.linear_config(n, k, xdt, None, m, wdt)
                if not in_use.tma or not in_use.reduce_in_tile:
                    continue
                xb = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                if kind == "w8a8":
                    x, xs = quantize_rows(xb)
                else:
                    x, xs = xb, None
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                def call(cfg, i, o=None):
                    w, sc = ws[i % copies]
                    return gemm._launch(x, w, out if o is None else o, None, None, cfg, sc, x_scale=xs)
                ref = call(in_use, 0, torch.empty_like(out)).view(torch.int16)
                rows = {"in_use": str(in_use)}
                it = itertools.count()
                elem = x.element_size()
                welem = 1 if wdt is not None else 2
                shapes = [(128, 128), (64, 128), (128, 64), (64, 256), (64, 64)]
                for (bm, bn), bk, st in itertools.product(shapes, (64, 128), (3, 4, 5, 6, 7)):
                    warps = 8 if bm * bn >= 128 * 128 or bn == 256 else 4
                    if st * (bm * elem + bn * welem) * bk > SMEM - 2048:
                        continue
                    cfg = gemm.LinearConfig(bm, bn, bk, warps, st, split_k=plan.split_k, tma=True, reduce_in_tile=True)
                    if cfg.k_bounds(k) != plan.k_bounds(k):
                        continue
                    label = f"{bm}x{bn}x{bk} w{warps} s{st}"
                    try:
                        t = cuda_time_ms(lambda c=cfg: call(c, next(it)), iters=20) * 1e3
                        same = bool(torch.equal(call(cfg, 0, torch.empty_like(out)).view(torch.int16), ref))
                        rows[label] = {"us": round(t, 2), "same_bits": same}
                    except Exception as exc:
                        rows[label] = {"error": str(exc)[:120]}
                good = {l: r for l, r in rows.items() if isinstance(r, dict) and "us" in r}
                best = sorted(good.items(), key=lambda kv: kv[1]["us"])[:5]
                cur = next((r for l, r in good.items() if l.startswith(f"{in_use.block_m}x{in_use.block_n}x{in_use.block_k} w{in_use.num_warps} s{in_use.num_stages}")), None)
                print(kind, name, m, "in use", in_use.block_m, in_use.block_n, in_use.block_k, in_use.num_stages, cur, "best", best,
                      "bits all same:", all(r["same_bits"] for r in good.values()), flush=True)
                res[f"{kind} {name} M={m}"] = rows
                json.dump(res, open(OUT, "w"), indent=1)

t0 = time.time()
run()
print("done", time.time() - t0)
