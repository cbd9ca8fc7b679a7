"""FP8 W8A16 decode tiles on the H200 after the change: tl.cast widening vs inline integer widening at
linear_config's FP8 tile, and K-step / stage candidates of the inline path; bits against the chosen tile."""
import dataclasses, functools, itertools, json, os, sys
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import gemm, fp8

W = [("qkv", 6144, 2048, None), ("o", 2048, 2048, None), ("gate_up", 11264, 2048, "swiglu"), ("down", 2048, 5632, None),
     ("h.proj", 5280, 5280, None)]
ROWS = (1, 16, 64, 256)
inline = gemm.inline_widening

def main(outdir):
    res = {}
    for name, n, k, act in W:
        n_out = n // 2 if act else n
        wb = torch.randn(n, k, device="cuda").mul(k ** -0.5).bfloat16()
        w8, s8 = fp8.quantize_weight_fp8(wb)
        wbs = [wb] + [wb.clone() for _ in range(max(2, min(32, (512 << 20) // (n * k * 2))) - 1)]
        w8s = [w8] + [w8.clone() for _ in range(max(2, min(32, (512 << 20) // (n * k))) - 1)]
        for m in ROWS:
            x = torch.randn(m, k, device="cuda").bfloat16()
            out = torch.empty(m, n_out, dtype=torch.bfloat16, device="cuda")
            bcfg = gemm.linear_config(n, k, torch.bfloat16, act, m)
            cfg = gemm.linear_config(n, k, torch.bfloat16, act, m, fp8.FP8_DTYPE)
            it = itertools.cycle([functools.partial(gemm._launch, x, w, out, None, act, bcfg) for w in wbs])
            row = {"bf16_cfg": dataclasses.asdict(bcfg), "fp8_cfg": dataclasses.asdict(cfg),
                   "bf16_us": cuda_time_ms(lambda: next(it)(), iters=40) * 1e3}
            ref = gemm._launch(x, w8, torch.empty_like(out), None, act, cfg, weight_scale=s8).clone()

            def timed(c):
                got = gemm._launch(x, w8, torch.empty_like(out), None, act, c, weight_scale=s8)
                it = itertools.cycle([functools.partial(gemm._launch, x, w, out, None, act, c, weight_scale=s8) for w in w8s])
                return {"us": cuda_time_ms(lambda: next(it)(), iters=40) * 1e3,
                        "bits": bool(torch.equal(ref.view(torch.int16), got.view(torch.int16)))}
            gemm.inline_widening = lambda: False
            row["cast_bf16_tile"] = timed(bcfg)
            row["cast"] = timed(cfg)
            gemm.inline_widening = inline
            row["inline_bf16_tile"] = timed(bcfg)
            row["inline"] = timed(cfg)
            cands = []
            if cfg.swap_ab:
                for bk, st in itertools.product((128, 256, 512), (3, 4, 5, 6, 8)):
                    c = dataclasses.replace(cfg, block_k=bk, num_stages=st)
                    if c != cfg and c.k_bounds(k) == cfg.k_bounds(k) and st * (cfg.block_m * 2 + (2 if act else 1) * cfg.block_n) * bk <= 200 * 1024:
                        cands.append(c)
            row["candidates"] = []
            for c in cands:
                try:
                    r = timed(c)
                except Exception:  # noqa: BLE001
                    continue
                row["candidates"].append({"block_k": c.block_k, "stages": c.num_stages, **r})
            best = min(row["candidates"] or [dict(row["inline"], block_k=cfg.block_k, stages=cfg.num_stages)], key=lambda r: r["us"])
            res[f"{name} M={m}"] = row
            print(f"{name:8s} M={m:<4d} fp8 tile {cfg.block_m}x{cfg.block_n}x{cfg.block_k} s{cfg.num_stages}{' T' if cfg.swap_ab else ''} "
                  f"bf16 {row['bf16_us']:6.2f} | cast {row['cast_bf16_tile']['us']:6.2f} / {row['cast']['us']:6.2f} | inline {row['inline_bf16_tile']['us']:6.2f} / {row['inline']['us']:6.2f}"
                  f" | best cand {best['us']:6.2f} bk{best['block_k']} s{best['stages']} | bits {all(r['bits'] for r in [row['cast'], row['inline_bf16_tile'], row['cast_bf16_tile']] + row['candidates'])}", flush=True)
        del wbs, w8s
        torch.cuda.empty_cache()
    json.dump(res, open(os.path.join(outdir, "fp8_inline_sweep.json"), "w"), indent=1)

if __name__ == "__main__":
    main(sys.argv[1])
