"""W8A8 o and down at decode rows: quantize_rows + the W8A8 linear-residual-norm (two launches)
against the linear quantizing its rows on load (quantize_x), against the product alone (rows already
FP8); weights rotate over 24 copies (HBM), every call in one CUDA graph, dependent launches as the engine."""
import itertools, json, sys
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import gemm
from rlt_kernels.fp8 import FP8_DTYPE, quantize_weight_fp8
from rlt_kernels.fp8_rows import quantize_rows
from rlt_kernels.linear_norm import linear_residual_norm

COPIES = 24
res = {"qorl": gemm.QUANTIZE_ON_LOAD_ROWS}
for name, n, k in (("o", 2048, 2048), ("down", 2048, 5632)):
    ws = [quantize_weight_fp8(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5) for _ in range(COPIES)]
    post, nxt = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for m in (1, 2, 4, 8, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        xq, xs = quantize_rows(x)
        residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        r_out = torch.empty_like(residual)
        nq, ns = torch.empty(m, n, device="cuda", dtype=FP8_DTYPE), torch.empty(m, device="cuda")
        it = itertools.count()

        def two(i=None):
            w, s = ws[next(it) % COPIES if i is None else i]
            quantize_rows(x, out=xq, out_scale=xs)
            return linear_residual_norm(xq, w, residual, post, nxt, 1e-6, weight_scale=s, x_scale=xs,
                                        residual_out=r_out, normed_out=nq, normed_scale=ns)

        def fused(i=None):
            w, s = ws[next(it) % COPIES if i is None else i]
            return linear_residual_norm(x, w, residual, post, nxt, 1e-6, weight_scale=s, quantize_x=True,
                                        residual_out=r_out, normed_out=nq, normed_scale=ns)

        def product(i=None):
            w, s = ws[next(it) % COPIES if i is None else i]
            return linear_residual_norm(xq, w, residual, post, nxt, 1e-6, weight_scale=s, x_scale=xs,
                                        residual_out=r_out, normed_out=nq, normed_scale=ns)

        outs = {}
        for v, fn in (("two", two), ("fused", fused)):
            fn(0)
            torch.cuda.synchronize()
            outs[v] = (r_out.clone(), nq.view(torch.uint8).clone(), ns.clone())
        same = all(torch.equal(a, b) for a, b in zip(outs["two"], outs["fused"]))
        row = {"same_bits": same}
        for v, fn in (("two", two), ("fused", fused), ("product", product)):
            row[v] = round(cuda_time_ms(fn, iters=100) * 1e3, 2)
        res[f"{name} M={m}"] = row
        print(name, m, row, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
