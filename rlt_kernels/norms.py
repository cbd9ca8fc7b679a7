"""RMSNorm (plain and fused with the residual), SwiGLU and rotary embeddings.

Numerics shared by the kernels and their references:

* RMSNorm statistics are fp32 (fp64 for fp64 inputs): ``x / sqrt(mean(x^2) + eps)`` is
  rounded to the input dtype first and then multiplied by the weight in the input dtype, as
  the Ouro and Huginn checkpoints were trained.
* One row per program: a row's result never depends on other rows (batch invariant).
* A float8_e4m3fn output (``out`` of `rms_norm`, ``normed_out`` of `residual_norm`) takes the normed
  rows as W8A8 linear inputs: the rows in the input dtype, quantized by `fp8_rows`' rule in the
  same kernel (scales in ``out_scale`` / ``normed_scale``, fp32 [M]). The references give exactly
  `fp8_rows.quantize_rows_reference` of their unquantized output, and so do the kernels under the
  interpreter; on the GPU the kernel that writes FP8 holds 16 elements of a row per thread where
  the 16-bit one holds 8 (Triton sizes them by the stores), so its mean square may add the terms in
  another order and a row's bits can differ from the 16-bit kernel's (one kernel, one order: batch
  invariance holds either way).
* ``active_rows`` (int32 device tensor, shape [1]) limits work to the leading rows; rows at
  or past the count are not written.

The Triton kernels (`rms_norm`, `residual_norm`, `swiglu`, `apply_rope`) take bf16/fp16/fp32
tensors whose last dimension is contiguous (row strides are free, so slices of a wider buffer
need no copy); fp64 runs on the references only. A norm row is one padded power-of-two block
(up to ``MAX_NORM_WIDTH`` elements), so its reduction order depends only on the width.
"""

from __future__ import annotations

import torch

from ._rows import active_count, by_row_chunks, compute_dtype
from ._pdl import pdl_launch, wait_for_inputs
from ._triton import check_launchable, tl, triton
from .fp8 import FP8_DTYPE
from .fp8_rows import check_fp8_rows, quantize_row, quantize_rows_reference
from .split_partials import SplitPartials

MAX_NORM_WIDTH = 32768
_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(compute_dtype(x.dtype))
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight.to(x.dtype)


def rms_norm_reference(x, weight, eps, *, out=None, active_rows=None, out_scale=None):
    """RMSNorm. x [M, N] (bf16/fp16/fp32/fp64), weight [N] -> out [M, N] in x.dtype, or the
    normed rows quantized into a float8_e4m3fn ``out`` with fp32 ``out_scale`` [M]."""
    m = active_count(active_rows, x.shape[0])
    out = torch.empty_like(x) if out is None else out
    if m:
        normed = by_row_chunks(_rms, x[:m], weight, eps)
        if out.dtype == FP8_DTYPE:
            quantize_rows_reference(normed, out=out[:m], out_scale=out_scale[:m])
        else:
            out[:m] = normed
    return out


def _residual_norm(packed, post_weight, next_weight, eps, mode, width):
    sub, residual = packed[:, :width], packed[:, width:]
    if mode == "ouro":
        new_residual = residual + _rms(sub, post_weight, eps)
    else:
        new_residual = _rms(residual + sub, post_weight, eps)
    if next_weight is None:
        return new_residual
    return torch.cat([new_residual, _rms(new_residual, next_weight, eps)], dim=1)


def residual_norm_reference(
    sub, residual, post_weight, next_weight, eps, *, mode="ouro", residual_out=None, normed_out=None, active_rows=None,
    normed_scale=None,
):
    """Sandwich-norm residual update, optionally followed by the next pre-norm.

    sub, residual: [M, N] same dtype; post_weight, next_weight: [N] (next_weight may be None).
    mode "ouro":   r = residual + rms(sub; post_weight)      (norm the sublayer output, then add)
    mode "huginn": r = rms(residual + sub; post_weight)      (add, then norm the sum)
    n = rms(r; next_weight) when next_weight is given (quantized into a float8_e4m3fn
    ``normed_out`` with fp32 ``normed_scale`` [M] when normed_out is FP8).
    Returns (r, n) with n None when next_weight is None. residual_out may alias residual.
    """
    if mode not in ("ouro", "huginn"):
        raise ValueError(f"mode must be 'ouro' or 'huginn', got {mode!r}")
    width = sub.shape[1]
    m = active_count(active_rows, sub.shape[0])
    residual_out = torch.empty_like(residual) if residual_out is None else residual_out
    if next_weight is not None and normed_out is None:
        normed_out = torch.empty_like(sub)
    if m:
        packed = torch.cat([sub[:m], residual[:m]], dim=1)
        res = by_row_chunks(_residual_norm, packed, post_weight, next_weight, eps, mode, width)
        if next_weight is None:
            residual_out[:m] = res
        else:
            residual_out[:m] = res[:, :width]
            if normed_out.dtype == FP8_DTYPE:
                quantize_rows_reference(res[:, width:], out=normed_out[:m], out_scale=normed_scale[:m])
            else:
                normed_out[:m] = res[:, width:]
    return residual_out, (normed_out if next_weight is not None else None)


def swiglu_reference(gate_up, *, out=None, active_rows=None):
    """SwiGLU. gate_up [M, 2F] = [gate | up] -> out [M, F] = silu(gate) * up (fp32 math)."""
    f = gate_up.shape[1] // 2
    m = active_count(active_rows, gate_up.shape[0])
    out = torch.empty((gate_up.shape[0], f), dtype=gate_up.dtype, device=gate_up.device) if out is None else out
    if m:
        g = gate_up[:m, :f].to(compute_dtype(gate_up.dtype))
        u = gate_up[:m, f:].to(compute_dtype(gate_up.dtype))
        out[:m] = (torch.nn.functional.silu(g) * u).to(gate_up.dtype)
    return out


def rope_cos_sin(max_positions: int, rotary_dim: int, theta: float, device=None) -> torch.Tensor:
    """fp32 table [max_positions, rotary_dim]: cos of the rotary_dim/2 angles, then their sin.

    angle(p, i) = p * theta^(-2i/rotary_dim), computed in fp32 like the reference models.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).float() / rotary_dim))
    pos = torch.arange(max_positions, dtype=torch.int64, device=device).float()
    angles = torch.outer(pos, inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """x [T, H, D] in compute dtype; cos, sin [T, D/2]."""
    cos = cos[:, None, :]
    sin = sin[:, None, :]
    if style == "neox":
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x2 * cos + x1 * sin
    return out


def apply_rope_reference(x, positions, cos_sin, *, style="neox", bias=None, out=None, active_rows=None):
    """Rotary embedding. x [T, H, D], positions [T] int, cos_sin [P, D] fp32 (see rope_cos_sin).

    style "neox": rotate-half (dim i pairs with i + D/2; Ouro). style "gptj": interleaved pairs
    (2i, 2i+1; Huginn). bias [H, D] is added before rotating (Huginn's q/k bias). Math in fp32,
    rounded once to x.dtype.
    """
    if style not in ("neox", "gptj"):
        raise ValueError(f"style must be 'neox' or 'gptj', got {style!r}")
    m = active_count(active_rows, x.shape[0])
    out = torch.empty_like(x) if out is None else out
    if m:
        cd = compute_dtype(x.dtype)
        xs = x[:m].to(cd)
        if bias is not None:
            xs = xs + bias.to(cd)
        half = x.shape[-1] // 2
        cs = cos_sin[positions[:m].long()].to(cd)
        out[:m] = _rotate(xs, cs[:, :half], cs[:, half:], style).to(x.dtype)
    return out


# ---------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------


@triton.jit
def silu_mul(gate, up):
    """silu(gate) * up on fp32 tensors (shared with the fused SwiGLU epilogue of `linear`)."""
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _rms_row(x, weight, width, eps):
    """RMSNorm of one row block: fp32 statistics, normalised value rounded to x.dtype, then
    multiplied by the weight in x.dtype. Padding lanes of x must be zero."""
    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=0) / width
    normed = (xf * tl.rsqrt(mean_sq + eps)).to(x.dtype)
    return (normed.to(tl.float32) * weight.to(x.dtype).to(tl.float32)).to(x.dtype)


@triton.jit
def _row_is_live(active_ptr, row, HAS_ACTIVE: tl.constexpr):
    if HAS_ACTIVE:
        return row < tl.load(active_ptr)
    return True


@triton.jit
def _store_row(out_ptr, out_scale_ptr, row, cols, ok, y, QUANTIZE: tl.constexpr):
    """out[row] = y (out_ptr points at the row), or y quantized to FP8 with its scale (`fp8_rows`)."""
    if QUANTIZE:
        q, scale = quantize_row(y)
        tl.store(out_ptr + cols, q, mask=ok)
        tl.store(out_scale_ptr + row, scale)
    else:
        tl.store(out_ptr + cols, y, mask=ok)


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, out_ptr, out_scale_ptr, active_ptr, width, stride_x, stride_out, eps,
    HAS_ACTIVE: tl.constexpr, QUANTIZE: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    if _row_is_live(active_ptr, row, HAS_ACTIVE):
        cols = tl.arange(0, BLOCK)
        ok = cols < width
        x = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=ok, other=0.0)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0)
        _store_row(out_ptr + row.to(tl.int64) * stride_out, out_scale_ptr, row, cols, ok, _rms_row(x, w, width, eps),
                   QUANTIZE)


@triton.jit
def _residual_norm_kernel(
    sub_ptr, res_ptr, post_w_ptr, next_w_ptr, res_out_ptr, normed_ptr, normed_scale_ptr, active_ptr, parts_ptr,
    scale_ptr, row_scale_ptr, m, width, stride_sub, stride_res, stride_res_out, stride_normed, eps,
    HUGINN: tl.constexpr, HAS_NEXT: tl.constexpr, HAS_ACTIVE: tl.constexpr, SPLITS: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_ROW_SCALE: tl.constexpr, QUANTIZE: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    if _row_is_live(active_ptr, row, HAS_ACTIVE):
        row64 = row.to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < width
        res = tl.load(res_ptr + row64 * stride_res + cols, mask=ok, other=0.0)
        if SPLITS == 0:
            sub = tl.load(sub_ptr + row64 * stride_sub + cols, mask=ok, other=0.0)
        else:  # a split-K linear's fp32 partials: gemm's reduction (range order, then the scale), rounded
            acc = tl.zeros((BLOCK,), dtype=tl.float32)
            for s in tl.static_range(SPLITS):
                acc += tl.load(parts_ptr + (s * m + row64) * width + cols, mask=ok, other=0.0)
            if HAS_SCALE:
                acc = acc * tl.load(scale_ptr + cols, mask=ok, other=1.0)
            if HAS_ROW_SCALE:
                acc = acc * tl.load(row_scale_ptr + row)
            sub = acc.to(res.dtype)
        post_w = tl.load(post_w_ptr + cols, mask=ok, other=0.0)
        if HUGINN:
            summed = (res.to(tl.float32) + sub.to(tl.float32)).to(sub.dtype)
            new_res = _rms_row(summed, post_w, width, eps)
        else:
            new_res = (res.to(tl.float32) + _rms_row(sub, post_w, width, eps).to(tl.float32)).to(sub.dtype)
        tl.store(res_out_ptr + row64 * stride_res_out + cols, new_res, mask=ok)
        if HAS_NEXT:
            next_w = tl.load(next_w_ptr + cols, mask=ok, other=0.0)
            _store_row(normed_ptr + row64 * stride_normed, normed_scale_ptr, row, cols, ok,
                       _rms_row(new_res, next_w, width, eps), QUANTIZE)


@triton.jit
def _swiglu_kernel(
    gate_up_ptr, out_ptr, active_ptr, f, stride_in, stride_out,
    HAS_ACTIVE: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    if _row_is_live(active_ptr, row, HAS_ACTIVE):
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < f
        src = gate_up_ptr + row.to(tl.int64) * stride_in + cols
        gate = tl.load(src, mask=ok, other=0.0)
        up = tl.load(src + f, mask=ok, other=0.0)
        result = silu_mul(gate.to(tl.float32), up.to(tl.float32)).to(gate.dtype)
        tl.store(out_ptr + row.to(tl.int64) * stride_out + cols, result, mask=ok)


@triton.jit
def _rope_kernel(
    x_ptr, pos_ptr, cos_sin_ptr, bias_ptr, out_ptr, active_ptr, heads, half,
    stride_xt, stride_xh, stride_ot, stride_oh, stride_cs, stride_bias,
    GPTJ: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ACTIVE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0)
    if _row_is_live(active_ptr, token, HAS_ACTIVE):
        h = tl.arange(0, BLOCK_H)
        i = tl.arange(0, BLOCK_HALF)
        i_ok = i < half
        ok = (h < heads)[:, None] & i_ok[None, :]
        if GPTJ:
            d1 = 2 * i
            d2 = 2 * i + 1
        else:
            d1 = i
            d2 = i + half
        pos = tl.load(pos_ptr + token).to(tl.int64)
        cos = tl.load(cos_sin_ptr + pos * stride_cs + i, mask=i_ok, other=0.0).to(tl.float32)[None, :]
        sin = tl.load(cos_sin_ptr + pos * stride_cs + half + i, mask=i_ok, other=0.0).to(tl.float32)[None, :]
        src = x_ptr + token.to(tl.int64) * stride_xt + h.to(tl.int64)[:, None] * stride_xh
        x1 = tl.load(src + d1[None, :], mask=ok, other=0.0)
        x2 = tl.load(src + d2[None, :], mask=ok, other=0.0)
        dtype = x1.dtype
        x1 = x1.to(tl.float32)
        x2 = x2.to(tl.float32)
        if HAS_BIAS:
            b = bias_ptr + h[:, None] * stride_bias
            x1 += tl.load(b + d1[None, :], mask=ok, other=0.0).to(tl.float32)
            x2 += tl.load(b + d2[None, :], mask=ok, other=0.0).to(tl.float32)
        dst = out_ptr + token.to(tl.int64) * stride_ot + h.to(tl.int64)[:, None] * stride_oh
        tl.store(dst + d1[None, :], (x1 * cos - x2 * sin).to(dtype), mask=ok)
        tl.store(dst + d2[None, :], (x2 * cos + x1 * sin).to(dtype), mask=ok)


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------


def _check_kernel_dtype(t: torch.Tensor, name: str) -> None:
    if t.dtype not in _KERNEL_DTYPES:
        raise ValueError(f"{name} must be bf16, fp16 or fp32 for the Triton kernel (got {t.dtype}); "
                         "fp64 runs on rlt_kernels.reference")


def _check_rows(t: torch.Tensor, name: str, shape: tuple, dtype: torch.dtype) -> None:
    """t must have this shape and dtype and a contiguous last dimension."""
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension")


def _check_vector(t: torch.Tensor, name: str, width: int) -> None:
    if t.dim() != 1 or t.shape[0] != width or (width > 1 and t.stride(0) != 1):
        raise ValueError(f"{name} must be a contiguous vector of {width} elements, got shape {tuple(t.shape)}")


def _row_block(width: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for one row of ``width`` elements: a fixed function of the width."""
    if width > MAX_NORM_WIDTH:
        raise ValueError(f"norm rows are limited to {MAX_NORM_WIDTH} elements, got {width}")
    block = triton.next_power_of_2(max(width, 16))
    return block, min(16, max(4, block // 512))


def _active_args(active_rows, like):
    """(pointer argument, HAS_ACTIVE) for an optional device-side active-row count."""
    if active_rows is None:
        return like, False
    if active_rows.numel() < 1 or active_rows.dtype not in (torch.int32, torch.int64):
        raise ValueError("active_rows must be an int32 tensor of shape [1]")
    return active_rows, True


def rms_norm(x, weight, eps, *, out=None, active_rows=None, out_scale=None):
    """RMSNorm (Triton). x [M, N] bf16/fp16/fp32 (row stride free), weight [N] -> out [M, N] in
    x.dtype, or float8_e4m3fn with ``out_scale`` fp32 [M] (the normed rows quantized, see the
    module docstring). One row per program; rows at or past ``active_rows[0]`` are not written."""
    _check_kernel_dtype(x, "x")
    m, width = x.shape
    _check_rows(x, "x", (m, width), x.dtype)
    _check_vector(weight, "weight", width)
    out = torch.empty_like(x) if out is None else out
    quantize = _check_normed_out(out, out_scale, "out", (m, width), x.dtype)
    check_launchable(x, weight, out, out_scale, active_rows)
    if m == 0 or width == 0:
        return out
    block, warps = _row_block(width)
    active, has_active = _active_args(active_rows, x)
    pdl = pdl_launch(out)
    _rms_norm_kernel[(m,)](
        x, weight, out, out_scale if quantize else out, active, width, x.stride(0), out.stride(0), float(eps),
        HAS_ACTIVE=has_active, QUANTIZE=quantize, BLOCK=block, PDL=pdl, num_warps=warps,
        enable_fp_fusion=False, launch_pdl=pdl,
    )
    return out


def _check_normed_out(out, out_scale, name: str, shape: tuple, dtype) -> bool:
    """Check a norm's output: ``dtype`` rows, or float8_e4m3fn rows with fp32 scales [M] in
    ``<name>_scale`` (``out_scale`` here); returns whether it is the quantized form."""
    if out.dtype == FP8_DTYPE:
        check_fp8_rows(out, out_scale, name, shape)
        return True
    _check_rows(out, name, shape, dtype)
    if out_scale is not None:
        raise ValueError(f"{name}_scale is for a float8_e4m3fn {name}, got a {out.dtype} {name}")
    return False


def residual_norm(
    sub, residual, post_weight, next_weight, eps, *, mode="ouro", residual_out=None, normed_out=None, active_rows=None,
    normed_scale=None,
):
    """Sandwich-norm residual update, optionally followed by the next pre-norm (Triton).

    Same contract as `residual_norm_reference`: sub, residual [M, N] (same dtype, row strides
    free); mode "ouro": r = residual + rms(sub; post_weight); mode "huginn":
    r = rms(residual + sub; post_weight); n = rms(r; next_weight) when next_weight is given, in
    the same kernel (quantized into a float8_e4m3fn ``normed_out`` with ``normed_scale`` fp32 [M]
    when normed_out is FP8). Returns (r, n), n None without next_weight. residual_out may alias
    residual (in-place update). ``sub`` may also be the `SplitPartials` of a split-K
    `gemm.linear_partials`: the kernel then adds them as `gemm.linear` would (same bits).
    """
    if mode not in ("ouro", "huginn"):
        raise ValueError(f"mode must be 'ouro' or 'huginn', got {mode!r}")
    parts = sub if isinstance(sub, SplitPartials) else None
    if parts is not None:
        _check_partials(parts, residual)
        sub = residual  # stands in for the sub pointer the kernel does not read
    _check_kernel_dtype(sub, "sub")
    m, width = sub.shape
    _check_rows(sub, "sub", (m, width), sub.dtype)
    _check_rows(residual, "residual", (m, width), sub.dtype)
    _check_vector(post_weight, "post_weight", width)
    residual_out = torch.empty_like(residual) if residual_out is None else residual_out
    _check_rows(residual_out, "residual_out", (m, width), sub.dtype)
    if next_weight is not None:
        _check_vector(next_weight, "next_weight", width)
        normed_out = torch.empty_like(residual) if normed_out is None else normed_out
        quantize = _check_normed_out(normed_out, normed_scale, "normed_out", (m, width), sub.dtype)
    else:
        quantize = False
    check_launchable(sub, residual, post_weight, next_weight, residual_out, normed_out, normed_scale, active_rows)
    normed = normed_out if next_weight is not None else None
    if m == 0 or width == 0:
        return residual_out, normed
    block, warps = _row_block(width)
    active, has_active = _active_args(active_rows, sub)
    workspace = parts.workspace if parts is not None else sub
    scale = parts.scale if parts is not None and parts.scale is not None else workspace
    row_scale = parts.row_scale if parts is not None and parts.row_scale is not None else workspace
    pdl = pdl_launch(sub)
    _residual_norm_kernel[(m,)](
        sub, residual, post_weight, post_weight if next_weight is None else next_weight, residual_out,
        residual_out if normed is None else normed, normed_scale if quantize else workspace, active, workspace, scale,
        row_scale, m, width,
        sub.stride(0), residual.stride(0), residual_out.stride(0), (residual_out if normed is None else normed).stride(0),
        float(eps), HUGINN=mode == "huginn", HAS_NEXT=normed is not None, HAS_ACTIVE=has_active,
        SPLITS=parts.splits if parts is not None else 0, HAS_SCALE=parts is not None and parts.scale is not None,
        HAS_ROW_SCALE=parts is not None and parts.row_scale is not None, QUANTIZE=quantize,
        BLOCK=block, PDL=pdl, num_warps=warps, enable_fp_fusion=False,  # rounding exactly as the reference
        launch_pdl=pdl,
    )
    return residual_out, normed


def _check_partials(parts: SplitPartials, residual: torch.Tensor) -> None:
    """Partials must match the residual's rows, width and dtype and be contiguous fp32."""
    ws = parts.workspace
    if ws.dtype != torch.float32 or ws.dim() != 3 or not ws.is_contiguous():
        raise ValueError(f"split partials must be a contiguous fp32 [splits, M, N] workspace, got {ws.dtype} "
                         f"{tuple(ws.shape)}")
    if parts.shape != tuple(residual.shape) or parts.dtype != residual.dtype:
        raise ValueError(f"split partials of shape {parts.shape} rounding to {parts.dtype} do not match the residual "
                         f"{tuple(residual.shape)} {residual.dtype}")
    for name, t, n in (("scale", parts.scale, ws.shape[2]), ("row_scale", parts.row_scale, ws.shape[1])):
        if t is not None and (t.dtype != torch.float32 or tuple(t.shape) != (n,)):
            raise ValueError(f"split partials' {name} must be fp32 [{n}], got {t.dtype} {tuple(t.shape)}")


_SWIGLU_BLOCK = 1024


def swiglu(gate_up, *, out=None, active_rows=None):
    """SwiGLU (Triton). gate_up [M, 2F] = [gate | up] (row stride free) -> out [M, F] =
    silu(gate) * up, fp32 math rounded once to gate_up.dtype."""
    _check_kernel_dtype(gate_up, "gate_up")
    m, two_f = gate_up.shape
    if two_f % 2:
        raise ValueError(f"gate_up must have an even number of columns, got {two_f}")
    f = two_f // 2
    _check_rows(gate_up, "gate_up", (m, two_f), gate_up.dtype)
    out = torch.empty((m, f), dtype=gate_up.dtype, device=gate_up.device) if out is None else out
    _check_rows(out, "out", (m, f), gate_up.dtype)
    check_launchable(gate_up, out, active_rows)
    if m == 0 or f == 0:
        return out
    block = min(_SWIGLU_BLOCK, triton.next_power_of_2(f))
    active, has_active = _active_args(active_rows, gate_up)
    _swiglu_kernel[(m, triton.cdiv(f, block))](
        gate_up, out, active, f, gate_up.stride(0), out.stride(0), HAS_ACTIVE=has_active, BLOCK=block, num_warps=4,
        enable_fp_fusion=True,
    )
    return out


def apply_rope(x, positions, cos_sin, *, style="neox", bias=None, out=None, active_rows=None):
    """Rotary embedding (Triton), same contract as `apply_rope_reference`.

    x [T, H, D] bf16/fp16/fp32 (token and head strides free, last dim contiguous; D even,
    e.g. 64/96/128), positions [T] int32/int64 (each < P), cos_sin [P, D] fp32 from
    `rope_cos_sin`, bias [H, D] or None (added before rotating). out [T, H, D] may alias x.
    One program per token covers all its heads; math in fp32, rounded once.
    """
    if style not in ("neox", "gptj"):
        raise ValueError(f"style must be 'neox' or 'gptj', got {style!r}")
    _check_kernel_dtype(x, "x")
    t, heads, dim = x.shape
    if dim % 2:
        raise ValueError(f"head_dim must be even, got {dim}")
    _check_rows(x, "x", (t, heads, dim), x.dtype)
    if positions.shape != (t,) or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"positions must be an int32/int64 tensor of shape ({t},)")
    if cos_sin.dim() != 2 or cos_sin.shape[1] != dim or cos_sin.stride(1) != 1:
        raise ValueError(f"cos_sin must be [P, {dim}] with a contiguous last dimension, got {tuple(cos_sin.shape)}")
    if bias is not None:
        _check_rows(bias, "bias", (heads, dim), bias.dtype)
    out = torch.empty_like(x) if out is None else out
    _check_rows(out, "out", (t, heads, dim), x.dtype)
    check_launchable(x, positions, cos_sin, bias, out, active_rows)
    if t == 0 or heads == 0 or dim == 0:
        return out
    active, has_active = _active_args(active_rows, x)
    block_h, block_half = triton.next_power_of_2(heads), triton.next_power_of_2(dim // 2)
    _rope_kernel[(t,)](
        x, positions, cos_sin, x if bias is None else bias, out, active, heads, dim // 2,
        x.stride(0), x.stride(1), out.stride(0), out.stride(1), cos_sin.stride(0),
        0 if bias is None else bias.stride(0),
        GPTJ=style == "gptj", HAS_BIAS=bias is not None, HAS_ACTIVE=has_active, BLOCK_H=block_h,
        BLOCK_HALF=block_half, num_warps=min(16, max(4, block_h * block_half // 512)),
        enable_fp_fusion=False,  # same fp32 operation order as the reference and rope_kv_scatter
    )
    return out
