"""Decode (M <= 64) transposed tiles fetched by TMA against the cp.async tiles in use, bf16 and FP8 weights."""
import concurrent.futures, functools, itertools, json, multiprocessing, os, time
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import gemm
from rlt_kernels.fp8 import FP8_DTYPE, quantize_weight_fp8
DT = torch.bfloat16
WEIGHTS = [("qkv", 6144, 2048, None), ("o", 2048, 2048, None), ("gate_up", 11264, 2048, "swiglu"),
           ("down", 2048, 5632, None), ("huginn.proj", 5280, 5280, None)]

def candidates(n, k, act, fp8, block_m):
    acc = 2 if act else 1
    plan = gemm.linear_config(n, k, DT, act)
    w_elem = 1 if fp8 else 2
    out = []
    for bn, bk, st, w in itertools.product((64, 128), (64, 128, 256), (3, 4, 6, 8), (4, 8)):
        if (bn == 128) != (w == 8): continue
        if st * (block_m * 2 + acc * bn * w_elem) * bk > 220 * 1024: continue
        cfg = gemm.LinearConfig(block_m, bn, bk, w, st, split_k=plan.split_k, swap_ab=True, tma=True)
        if cfg.k_bounds(k) != plan.k_bounds(k): continue
        out.append(cfg)
    return out

def compile_one(n, k, act, fp8, cfg):
    w = torch.randn(n, k, device="cuda")
    w, sc = quantize_weight_fp8(w) if fp8 else (w.to(DT), None)
    n_out = n // 2 if act else n
    try:
        for m in (1, 16):
            gemm._launch(torch.zeros(m, k, dtype=DT, device="cuda"), w, torch.empty(m, n_out, dtype=DT, device="cuda"), None, act, cfg, sc)
        torch.cuda.synchronize()
    except Exception as e:  # noqa
        return repr(e)[:160]
    return ""

def main():
    res = {}
    for fp8 in (False, True):
        for name, n, k, act in WEIGHTS:
            n_out = n // 2 if act else n
            w0 = torch.randn(n, k, device="cuda") * k ** -0.5
            w0, sc = quantize_weight_fp8(w0) if fp8 else (w0.to(DT), None)
            ws = [w0] + [w0.clone() for _ in range(max(1, min(24, (512 << 20) // w0.nbytes)) - 1)]
            for block_m, rows in ((16, (1, 16)), (64, (64,))):
                cands = candidates(n, k, act, fp8, block_m)
                with concurrent.futures.ProcessPoolExecutor(14, mp_context=multiprocessing.get_context("spawn")) as pool:
                    errs = list(pool.map(functools.partial(compile_one, n, k, act, fp8), cands))
                ok = [c for c, e in zip(cands, errs) if not e]
                line = []
                for m in rows:
                    x = torch.randn(m, k, dtype=DT, device="cuda"); out = torch.empty(m, n_out, dtype=DT, device="cuda")
                    cur = gemm.linear_config(n, k, DT, act, m, FP8_DTYPE if fp8 else None)
                    ref = gemm._launch(x, w0, torch.empty_like(out), None, act, cur, sc)
                    def t(cfg):
                        it = itertools.cycle([functools.partial(gemm._launch, x, w, out, None, act, cfg, sc) for w in ws])
                        return cuda_time_ms(lambda: next(it)(), iters=20) * 1e3
                    today = t(cur)
                    rs = []
                    for cfg in ok:
                        same = torch.equal(gemm._launch(x, w0, torch.empty_like(out), None, act, cfg, sc), ref)
                        rs.append({"cfg": [cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages], "us": t(cfg), "same_bits": same})
                    rs.sort(key=lambda r: r["us"])
                    res[f"{'fp8' if fp8 else 'bf16'} {name} M{m}"] = {"today": today, "today_cfg": str(cur), "candidates": rs}
                    line.append(f"M{m} today {today:.1f} best " + "; ".join(f"{r['cfg']} {r['us']:.1f}{'' if r['same_bits'] else ' BITS'}" for r in rs[:2]))
                print(f"{'fp8' if fp8 else 'bf16'} {name} ({len(ok)}/{len(cands)}): " + " | ".join(line), flush=True)
            del ws, w0
            torch.cuda.empty_cache()
    json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "skinny_tma_sweep.json"), "w"), indent=1, default=str)

if __name__ == "__main__":
    main()
