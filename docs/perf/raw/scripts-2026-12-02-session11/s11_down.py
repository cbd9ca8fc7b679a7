"""Split weights at prefill rows: the TMA tile adding its K ranges itself against partials + reduction."""
import dataclasses, json, sys
import torch
from perf.conftest import cuda_time_ms
from rlt_kernels import gemm
from rlt_kernels.norms import residual_norm
from rlt_kernels.linear_norm import linear_residual_norm

res = {}
for name, n, k in (("ouro down", 2048, 5632), ("huginn mlp_proj", 5280, 17920)):
    for m in (1024, 2048, 4096):
        cfg = gemm.linear_config(n, k, torch.bfloat16, None, m)
        old = dataclasses.replace(cfg, reduce_in_tile=False)
        copies = 8
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(copies)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        it = iter(range(10**9))
        def call(c):
            return lambda: gemm._launch(x, ws[next(it) % copies], out, None, None, c)
        t_new = cuda_time_ms(call(cfg)); t_old = cuda_time_ms(call(old))
        a = gemm._launch(x, ws[0], torch.empty_like(out), None, None, cfg)
        b = gemm._launch(x, ws[0], torch.empty_like(out), None, None, old)
        ref = torch.matmul(x, ws[0].T)
        t_cublas = cuda_time_ms(lambda: torch.matmul(x, ws[next(it) % copies].T))
        r = {"cfg": str(cfg), "in_tile_us": t_new * 1e3, "partials_us": t_old * 1e3, "cublas_us": t_cublas * 1e3,
             "same_bits": bool(torch.equal(a, b)), "max_err_vs_cublas": (a.float() - ref.float()).abs().max().item()}
        if name == "ouro down":  # as the layer runs it: linear + residual norm
            resid = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            pw = torch.randn(n, device="cuda", dtype=torch.bfloat16); nw = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            r["linear_residual_norm_us"] = cuda_time_ms(lambda: linear_residual_norm(x, ws[next(it) % copies], resid, pw, nw, 1e-6)) * 1e3
        res[f"{name} M={m}"] = r
        print(name, m, r, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
