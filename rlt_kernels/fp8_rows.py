"""FP8 activation rows: each row of a [M, K] tensor as e4m3 values times one power-of-two scale.

W8A8 linear layers (`gemm.linear` with float8_e4m3fn x and weight) take their input rows in this
form. The scale of a row depends on that row alone, so quantizing keeps batch invariance:

* scale = 2^(E - 7), E = floor(log2(amax)) of the row's largest magnitude (from amax's fp32
  exponent bits; at least 2^-126; 1 for an all-zero row). The row's values divided by it lie
  below 256, inside e4m3's ±448, and the division is exact (a power of two).
* Each value / scale is rounded to nearest even onto e4m3's grid (3 mantissa bits, subnormal
  spacing 2^-9). The kernels round in fp32 arithmetic before the cast, so the cast is exact and
  the bits do not depend on how a backend rounds its fp8 conversion (the Triton interpreter
  rounds ties away from zero; the GPU and torch round them to even).

The norm kernels write their normed rows in this form directly (`norms.rms_norm` and
`norms.residual_norm` with a float8_e4m3fn output and its ``*_scale``); `quantize_rows` does it for
any other producer, by the same rule (`quantize_row`).
"""

from __future__ import annotations

import torch

from ._pdl import pdl_launch, wait_for_inputs
from ._rows import active_count
from ._triton import check_launchable, tl, triton
from .fp8 import FP8_DTYPE

MAX_ROW_WIDTH = 32768
_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def empty_rows(x: torch.Tensor, out=None, out_scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, out_scale) for FP8 rows of x [M, K]: the given tensors, or new float8_e4m3fn [M, K]
    and fp32 [M] ones on x's device."""
    if out is None:
        out = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    if out_scale is None:
        out_scale = torch.empty((x.shape[0],), dtype=torch.float32, device=x.device)
    return out, out_scale


def row_scales_reference(amax: torch.Tensor) -> torch.Tensor:
    """fp32 [M] scales 2^(E - 7) of non-negative fp32 row maxima [M] (see the module docstring)."""
    exponent = (amax.float().contiguous().view(torch.int32) >> 23) & 0xFF
    biased = torch.where(amax > 0, torch.clamp(exponent - 7, min=1), torch.full_like(exponent, 127))
    return (biased << 23).view(torch.float32)


def quantize_rows_reference(x, *, out=None, out_scale=None, active_rows=None):
    """(q, scale): x [M, K] (bf16/fp16/fp32) as float8_e4m3fn [M, K] and fp32 [M], q * scale ≈ x.
    Rows at or past the active count are not written."""
    m = active_count(active_rows, x.shape[0])
    out, out_scale = empty_rows(x, out, out_scale)
    if m:
        xf = x[:m].float()
        scale = row_scales_reference(xf.abs().amax(dim=1) if x.shape[1] else xf.new_zeros(m))
        out[:m] = (xf / scale[:, None]).to(FP8_DTYPE)
        out_scale[:m] = scale
    return out, out_scale


@triton.jit
def quantize_row(y):
    """(e4m3 values, fp32 scale) of one row block y (padding lanes zero): the module's rule."""
    yf = y.to(tl.float32)
    amax = tl.max(tl.abs(yf), axis=0)
    exponent = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    biased = tl.where(amax > 0, tl.maximum(exponent - 7, 1), 127)
    v = yf * ((254 - biased) << 23).to(tl.float32, bitcast=True)  # y / scale, exact
    # Round |v| to nearest even at e4m3's spacing: adding 2^(e + 20) (e = max(exponent of |v|, -6))
    # leaves 3 mantissa bits of |v| in the fp32 sum, which rounds to nearest even; subtracting it is exact.
    mag = tl.abs(v)
    e = tl.maximum(((mag.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
    magic = ((e + 20 + 127) << 23).to(tl.float32, bitcast=True)
    rounded = (mag + magic) - magic
    # v's sign bit on the rounded magnitude: a negative value that rounds to zero stays -0, as in torch
    # (a negation may compile to 0 - x, which gives +0).
    sign = (v.to(tl.int32, bitcast=True) >> 31) << 31
    q = (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return q.to(tl.float8e4nv), (biased << 23).to(tl.float32, bitcast=True)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, active_ptr, width, stride_x, stride_q,
                          HAS_ACTIVE: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    live = True
    if HAS_ACTIVE:
        live = row < tl.load(active_ptr)
    if live:
        cols = tl.arange(0, BLOCK)
        ok = cols < width
        x = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=ok, other=0.0)
        q, scale = quantize_row(x)
        tl.store(q_ptr + row.to(tl.int64) * stride_q + cols, q, mask=ok)
        tl.store(scale_ptr + row, scale)


def check_fp8_rows(q: torch.Tensor, scale, name: str, shape: tuple) -> None:
    """q must be float8_e4m3fn of ``shape`` with a contiguous last dimension and ``scale`` a
    contiguous fp32 [M]; ValueError naming the arguments otherwise."""
    if tuple(q.shape) != tuple(shape) or q.dtype != FP8_DTYPE or (q.shape[-1] > 1 and q.stride(-1) != 1):
        raise ValueError(f"{name} must be float8_e4m3fn {tuple(shape)} with a contiguous last dimension, got "
                         f"{q.dtype} {tuple(q.shape)}")
    if scale is None or scale.dtype != torch.float32 or tuple(scale.shape) != (shape[0],) or not scale.is_contiguous():
        got = None if scale is None else f"{scale.dtype} {tuple(scale.shape)}"
        raise ValueError(f"float8_e4m3fn {name} needs {name}_scale: a contiguous fp32 tensor [{shape[0]}] (one "
                         f"scale per row), got {got}")


def quantize_rows(x, *, out=None, out_scale=None, active_rows=None):
    """`quantize_rows_reference` in Triton: one program per row; x [M, K] bf16/fp16/fp32 (row
    stride free), K <= MAX_ROW_WIDTH. Returns (q float8_e4m3fn [M, K], scale fp32 [M])."""
    if x.dim() != 2 or x.dtype not in _INPUT_DTYPES or (x.shape[1] > 1 and x.stride(1) != 1):
        raise ValueError(f"x must be a bf16/fp16/fp32 [M, K] tensor with a contiguous last dimension, got "
                         f"{x.dtype} {tuple(x.shape)}")
    m, width = x.shape
    if width > MAX_ROW_WIDTH:
        raise ValueError(f"rows are limited to {MAX_ROW_WIDTH} elements, got {width}")
    out, out_scale = empty_rows(x, out, out_scale)
    check_fp8_rows(out, out_scale, "out", (m, width))
    check_launchable(x, out, out_scale, active_rows)
    if m == 0:
        return out, out_scale
    block = triton.next_power_of_2(max(width, 16))
    pdl = pdl_launch(out)
    _quantize_rows_kernel[(m,)](
        x, out, out_scale, x if active_rows is None else active_rows, width, x.stride(0), out.stride(0),
        HAS_ACTIVE=active_rows is not None, BLOCK=block, PDL=pdl, num_warps=min(16, max(4, block // 512)),
        enable_fp_fusion=False, launch_pdl=pdl,
    )
    return out, out_scale
