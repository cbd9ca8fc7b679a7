"""Decode GEMVs at M = 1 (and W8A8 o/down with quantize_x) with and without an L2 prefetch of each
program's weight slice at its start; 24 rotating weight copies, one CUDA graph, dependent launches."""
import itertools, json, sys
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import gemm
from rlt_kernels.fp8 import FP8_DTYPE, quantize_weight_fp8
from rlt_kernels.fp8_rows import quantize_rows

COPIES = 24
res = {}
for name, n, k, act in (("qkv", 6144, 2048, None), ("o", 2048, 2048, None), ("gate_up", 11264, 2048, "swiglu"), ("down", 2048, 5632, None)):
    wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(COPIES)]
    w8 = [quantize_weight_fp8(w) for w in wb]
    for m in (1, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        xq, xs = quantize_rows(x)
        it = itertools.count()
        forms = {
            "bf16": lambda i=None: gemm.linear(x, wb[next(it) % COPIES if i is None else i], activation=act),
            "w8a8": lambda i=None: gemm.linear(xq, w8[(j := (next(it) % COPIES if i is None else i))][0], weight_scale=w8[j][1], x_scale=xs, activation=act),
            "w8a8 quantize_x": lambda i=None: gemm.linear(x, w8[(j := (next(it) % COPIES if i is None else i))][0], weight_scale=w8[j][1], activation=act, quantize_x=True),
        }
        for form, fn in forms.items():
            row = {}
            for pf in (False, True):
                gemm.L2_PREFETCH = pf
                try:
                    ref = fn(0).clone()
                    row["pf" if pf else "plain"] = round(cuda_time_ms(fn, iters=100) * 1e3, 2)
                    if pf:
                        gemm.L2_PREFETCH = False
                        row["same_bits"] = bool(torch.equal(fn(0), ref))
                except Exception as exc:
                    row["pf" if pf else "plain"] = repr(exc)[:300]
            gemm.L2_PREFETCH = False
            res[f"{name} {form} M={m}"] = row
            print(name, form, m, row, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
