"""FP8 GEMV/GEMM widening A/B on the H200: cast (tl.cast), inline (integer widening, element tiles),
words (int32 word loads + integer widening on transposed tiles), words + more stages. Bits against cast."""
import dataclasses, functools, itertools, json, os, sys, time
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import gemm, fp8

W = [("qkv", 6144, 2048, None), ("o", 2048, 2048, None), ("gate_up", 11264, 2048, "swiglu"), ("down", 2048, 5632, None)]
ROWS = (1, 16, 64, 256, 2048)
orig_inline, orig_words = gemm.inline_widening, gemm._fp8_words

def set_mode(mode):
    gemm.inline_widening = (lambda: False) if mode == "cast" else orig_inline
    gemm._fp8_words = orig_words if mode.startswith("words") else (lambda *a: False)

def main(outdir):
    res = {}
    for name, n, k, act in W:
        n_out = n // 2 if act else n
        wb = torch.randn(n, k, device="cuda").mul(k ** -0.5).bfloat16()
        copies_b = max(2, min(32, (512 << 20) // (n * k * 2)))
        copies_8 = max(2, min(32, (512 << 20) // (n * k)))
        wbs = [wb] + [wb.clone() for _ in range(copies_b - 1)]
        q = [fp8.quantize_weight_fp8(wb)] * 1
        w8, s8 = q[0]
        w8s = [w8] + [w8.clone() for _ in range(copies_8 - 1)]
        for m in ROWS:
            x = torch.randn(m, k, device="cuda").bfloat16()
            out = torch.empty(m, n_out, dtype=torch.bfloat16, device="cuda")
            cfg = gemm.linear_config(n, k, torch.bfloat16, act, m)
            row = {"cfg": dataclasses.asdict(cfg)}
            set_mode("cast")
            it = itertools.cycle([functools.partial(gemm._launch, x, w, out, None, act, cfg) for w in wbs])
            row["bf16_us"] = cuda_time_ms(lambda: next(it)(), iters=40) * 1e3
            ref = gemm._launch(x, w8, torch.empty_like(out), None, act, cfg, weight_scale=s8).clone()
            variants = [("cast", cfg), ("inline", cfg), ("words", cfg)]
            if cfg.swap_ab:
                for st in (8, 10, 12, 14):
                    if st != cfg.num_stages:
                        variants.append((f"words s{st}", dataclasses.replace(cfg, num_stages=st)))
            for mode, c in variants:
                set_mode(mode)
                try:
                    got = gemm._launch(x, w8, torch.empty_like(out), None, act, c, weight_scale=s8)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    row[mode] = {"error": str(e).splitlines()[0][:160]}
                    continue
                it = itertools.cycle([functools.partial(gemm._launch, x, w, out, None, act, c, weight_scale=s8) for w in w8s])
                us = cuda_time_ms(lambda: next(it)(), iters=40) * 1e3
                row[mode] = {"us": us, "bits": bool(torch.equal(ref.view(torch.int16), got.view(torch.int16)))}
            set_mode("words")
            res[f"{name} M={m}"] = row
            print(f"{name:8s} M={m:<5d} {cfg.block_m}x{cfg.block_n}x{cfg.block_k} s{cfg.num_stages}{' T' if cfg.swap_ab else ''} "
                  f"bf16 {row['bf16_us']:7.2f} | " + " | ".join(
                      f"{v} {row[v]['us']:7.2f}{'' if row[v]['bits'] else ' BITS!'}" if "us" in row[v] else f"{v} ERR {row[v]['error'][:60]}"
                      for v, _ in variants), flush=True)
        del wbs, w8s
        torch.cuda.empty_cache()
    json.dump(res, open(os.path.join(outdir, "fp8_ab.json"), "w"), indent=1)

if __name__ == "__main__":
    main(sys.argv[1])
