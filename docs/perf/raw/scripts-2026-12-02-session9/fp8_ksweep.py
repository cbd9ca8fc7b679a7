"""FP8 K-step / stage sweep on the H200 for W8A16 (inline widening) and W8A8 (rows quantized by
quantize_rows_fp8, FP8 wgmma); bits of each candidate against the default tile of the same mode."""
import dataclasses, functools, itertools, json, os, sys
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import gemm, fp8

W = [("qkv", 6144, 2048, None), ("o", 2048, 2048, None), ("gate_up", 11264, 2048, "swiglu"), ("down", 2048, 5632, None)]
ROWS = (1, 16, 64, 256)

def main(outdir):
    res = {}
    for name, n, k, act in W:
        n_out = n // 2 if act else n
        wb = torch.randn(n, k, device="cuda").mul(k ** -0.5).bfloat16()
        w8, s8 = fp8.quantize_weight_fp8(wb)
        copies_b = max(2, min(32, (512 << 20) // (n * k * 2)))
        copies_8 = max(2, min(32, (512 << 20) // (n * k)))
        wbs = [wb] + [wb.clone() for _ in range(copies_b - 1)]
        w8s = [w8] + [w8.clone() for _ in range(copies_8 - 1)]
        for m in ROWS:
            x = torch.randn(m, k, device="cuda").bfloat16()
            out = torch.empty(m, n_out, dtype=torch.bfloat16, device="cuda")
            base = gemm.linear_config(n, k, torch.bfloat16, act, m)
            it = itertools.cycle([functools.partial(gemm._launch, x, w, out, None, act, base) for w in wbs])
            row = {"cfg": dataclasses.asdict(base), "bf16_us": cuda_time_ms(lambda: next(it)(), iters=40) * 1e3}
            row["quantize_us"] = cuda_time_ms(lambda: gemm.quantize_rows_fp8(x), iters=40) * 1e3
            cands = [base]
            for bk, st in itertools.product((128, 256, 512), (3, 4, 6, 8)):
                c = dataclasses.replace(base, block_k=bk, num_stages=st)
                if c != base and c.k_bounds(k) == base.k_bounds(k) and st * (base.block_m * 2 + (2 if act else 1) * base.block_n) * bk <= 200 * 1024:
                    cands.append(c)
            for xq in (False, True):
                mode = "w8a8" if xq else "w8a16"
                ref = gemm._launch(x, w8, torch.empty_like(out), None, act, base, weight_scale=s8, x_fp8=xq).clone()
                rows = []
                for c in cands:
                    try:
                        got = gemm._launch(x, w8, torch.empty_like(out), None, act, c, weight_scale=s8, x_fp8=xq)
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001
                        continue
                    it = itertools.cycle([functools.partial(gemm._launch, x, w, out, None, act, c, weight_scale=s8, x_fp8=xq) for w in w8s])
                    rows.append({"block_k": c.block_k, "stages": c.num_stages, "us": cuda_time_ms(lambda: next(it)(), iters=40) * 1e3,
                                 "bits": bool(torch.equal(ref.view(torch.int16), got.view(torch.int16)))})
                row[mode] = rows
            res[f"{name} M={m}"] = row
            best = {md: min(row[md], key=lambda r: r["us"]) for md in ("w8a16", "w8a8")}
            print(f"{name:8s} M={m:<4d} {base.block_m}x{base.block_n}x{base.block_k} s{base.num_stages}{' T' if base.swap_ab else ''} bf16 {row['bf16_us']:6.2f} q {row['quantize_us']:5.2f} | "
                  + " | ".join(f"{md} default {row[md][0]['us']:6.2f} best {b['us']:6.2f} bk{b['block_k']} s{b['stages']} bits {all(r['bits'] for r in row[md])}" for md, b in best.items()), flush=True)
        del wbs, w8s
        torch.cuda.empty_cache()
    json.dump(res, open(os.path.join(outdir, "fp8_ksweep.json"), "w"), indent=1)

if __name__ == "__main__":
    main(sys.argv[1])
