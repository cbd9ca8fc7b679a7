"""bf16 vs FP8 weights (W8A16, integer widening) vs FP8 weights + activations (W8A8) at linear_config's
tiles on the H200, weights from HBM (rotating copies); W8A8 row-class bits against an M=1100 launch."""
import functools, itertools, json, os, sys
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import gemm, fp8

W = [("qkv", 6144, 2048, None), ("o", 2048, 2048, None), ("gate_up", 11264, 2048, "swiglu"), ("down", 2048, 5632, None)]
ROWS = (1, 16, 64, 256)

def main(outdir):
    res = {}
    for name, n, k, act in W:
        wb = torch.randn(n, k, device="cuda").mul(k ** -0.5).bfloat16()
        w8, s8 = fp8.quantize_weight_fp8(wb)
        wbs = [wb] + [wb.clone() for _ in range(max(2, min(32, (512 << 20) // (n * k * 2))) - 1)]
        w8s = [w8] + [w8.clone() for _ in range(max(2, min(32, (512 << 20) // (n * k))) - 1)]
        xf = torch.randn(1100, k, device="cuda").bfloat16()
        full = gemm.linear(xf, w8, weight_scale=s8, activation=act, fp8_activations=True)
        for m in ROWS:
            x = xf[:m]
            row = {}
            for mode, ws, kw in (("bf16", wbs, {}), ("w8a16", w8s, dict(weight_scale=s8)),
                                 ("w8a8", w8s, dict(weight_scale=s8, fp8_activations=True))):
                it = itertools.cycle([functools.partial(gemm.linear, x, w, activation=act, **kw) for w in ws])
                row[mode] = cuda_time_ms(lambda: next(it)(), iters=40) * 1e3
            row["w8a8_bits"] = bool(torch.equal(gemm.linear(x, w8, weight_scale=s8, activation=act, fp8_activations=True), full[:m]))
            res[f"{name} M={m}"] = row
            print(f"{name:8s} M={m:<4d} bf16 {row['bf16']:6.2f} | w8a16 {row['w8a16']:6.2f} | w8a8 {row['w8a8']:6.2f} "
                  f"({row['bf16'] / row['w8a8']:.2f}x bf16) bits {row['w8a8_bits']}", flush=True)
        del wbs, w8s
        torch.cuda.empty_cache()
    json.dump(res, open(os.path.join(outdir, "fp8_modes.json"), "w"), indent=1)

if __name__ == "__main__":
    main(sys.argv[1])
