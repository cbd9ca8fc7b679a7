"""Kernels for ncu: decode attention 256x192 (element, then 16-byte loads), skinny GEMVs at M = 1."""
import os, torch
from perf.bench_decode_attention import engine_case, rlt_call
from rlt_kernels import gemm
c = engine_case(256, 192)
for vec in ("0", "1"):
    os.environ["RLT_DECODE_VEC"] = vec
    o = torch.empty_like(c["q"]); f = rlt_call(c, o, 0)
    f(); f()
torch.cuda.synchronize()
x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
for n, k, act in ((6144, 2048, None), (2048, 2048, None), (11264, 2048, "swiglu"), (2048, 5632, None)):
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    xx = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    gemm.linear(xx, w, activation=act); gemm.linear(xx, w, activation=act)
    x2 = torch.randn(256, k, device="cuda", dtype=torch.bfloat16)
    gemm.linear(x2, w, activation=act)
torch.cuda.synchronize()
