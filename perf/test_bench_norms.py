"""Fused norms, SwiGLU and RoPE on the H200 at Ouro-1.4B (hidden 2048) and Huginn (5280) widths.

Each JSON entry holds the kernel time, GB/s on the bytes it must move and that as a fraction of
the measured copy bandwidth (target >= 60% where the size allows), and the speedup over the
unfused plain-torch computation of the same result. Inputs are rotated through enough copies
to exceed L2 at the larger sizes.

    pytest perf/test_bench_norms.py --benchmark-json=out/norms.json
"""

import itertools

import pytest
import torch

from perf.conftest import cuda_time_ms, record, requires_cuda
from rlt_kernels import norms

pytestmark = requires_cuda

ROWS = [1, 64, 256, 4096]
DTYPE = torch.bfloat16
EPS = 1e-6
ROTATION_BYTES = 256 * 1024 * 1024
MODELS = {  # hidden, FFN, heads, head_dim, rope style, rope theta, residual mode
    "ouro": (2048, 5632, 16, 128, "neox", 1e6, "ouro"),
    "huginn": (5280, 17920, 55, 96, "gptj", 50000.0, "huginn"),
}


def _torch_rms(x, w):
    """Plain-torch RMSNorm as a model would write it (several kernels)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w


def _torch_residual(sub, res, w1, w2, mode):
    r = res + _torch_rms(sub, w1) if mode == "ouro" else _torch_rms(res + sub, w1)
    return r, _torch_rms(r, w2)


def _rand(*shape):
    return torch.randn(*shape, dtype=DTYPE, device="cuda")


def _case(kind, model, m):
    """(make_inputs, kernel(inputs), torch(inputs), bytes moved per call) for one benchmark."""
    hidden, ffn, heads, head_dim, style, theta, mode = MODELS[model]
    e = DTYPE.itemsize
    if kind == "rms_norm":
        w = _rand(hidden)
        return (lambda: (_rand(m, hidden),), lambda x: norms.rms_norm(x, w, EPS), lambda x: _torch_rms(x, w),
                2 * m * hidden * e + hidden * e)
    if kind == "residual_norm":
        w1, w2 = _rand(hidden), _rand(hidden)
        return (lambda: (_rand(m, hidden), _rand(m, hidden)),
                lambda sub, res: norms.residual_norm(sub, res, w1, w2, EPS, mode=mode, residual_out=res),
                lambda sub, res: _torch_residual(sub, res, w1, w2, mode), 4 * m * hidden * e + 2 * hidden * e)
    if kind == "swiglu":
        return (lambda: (_rand(m, 2 * ffn),), norms.swiglu, norms.swiglu_reference, 3 * m * ffn * e)
    cos_sin = norms.rope_cos_sin(4096, head_dim, theta, device="cuda")
    bias = _rand(heads, head_dim) if style == "gptj" else None
    positions = torch.randint(0, 4096, (m,), device="cuda", dtype=torch.int32)
    return (lambda: (_rand(m, heads, head_dim),),
            lambda x: norms.apply_rope(x, positions, cos_sin, style=style, bias=bias, out=x),
            lambda x: norms.apply_rope_reference(x, positions, cos_sin, style=style, bias=bias),
            2 * m * heads * head_dim * e + m * head_dim * 4 + (0 if bias is None else heads * head_dim * e))


def _cycling(fn, inputs):
    it = itertools.cycle(inputs)
    return lambda: fn(*next(it))


CASES = [(kind, model, m) for kind in ("rms_norm", "residual_norm", "swiglu", "apply_rope")
         for model in MODELS for m in ROWS]


@pytest.mark.parametrize("kind,model,m", CASES, ids=[f"{k}-{mo}-M{m}" for k, mo, m in CASES])
def test_bench_norms(benchmark, roofline, kind, model, m):
    make_inputs, kernel, baseline, bytes_moved = _case(kind, model, m)
    copies = max(1, min(16, ROTATION_BYTES // max(bytes_moved, 1)))
    inputs = [make_inputs() for _ in range(copies)]
    ms = cuda_time_ms(_cycling(kernel, inputs))
    baseline_ms = cuda_time_ms(_cycling(baseline, inputs))
    record(benchmark, roofline, name=f"{kind} {model} M={m}", ms=ms, bytes_moved=bytes_moved,
           baseline_ms=baseline_ms, kind=kind, model=model, m=m)
    run = _cycling(kernel, inputs)

    def run_synced():
        run()
        torch.cuda.synchronize()

    benchmark.pedantic(run_synced, rounds=10, warmup_rounds=1)

