"""RMSNorm (plain and fused with the residual), SwiGLU and rotary embeddings.

Numerics shared by the kernels and their references:

* RMSNorm statistics are fp32 (fp64 for fp64 inputs): ``x / sqrt(mean(x^2) + eps)`` is
  rounded to the input dtype first and then multiplied by the weight in the input dtype, as
  the Ouro and Huginn checkpoints were trained.
* One row per program: a row's result never depends on other rows (batch invariant).
* ``active_rows`` (int32 device tensor, shape [1]) limits work to the leading rows; rows at
  or past the count are not written.
"""

from __future__ import annotations

import torch

from ._rows import active_count, by_row_chunks, compute_dtype


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(compute_dtype(x.dtype))
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight.to(x.dtype)


def rms_norm_reference(x, weight, eps, *, out=None, active_rows=None):
    """RMSNorm. x [M, N] (bf16/fp16/fp32/fp64), weight [N] -> out [M, N] in x.dtype."""
    m = active_count(active_rows, x.shape[0])
    out = torch.empty_like(x) if out is None else out
    if m:
        out[:m] = by_row_chunks(_rms, x[:m], weight, eps)
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
    sub, residual, post_weight, next_weight, eps, *, mode="ouro", residual_out=None, normed_out=None, active_rows=None
):
    """Sandwich-norm residual update, optionally followed by the next pre-norm.

    sub, residual: [M, N] same dtype; post_weight, next_weight: [N] (next_weight may be None).
    mode "ouro":   r = residual + rms(sub; post_weight)      (norm the sublayer output, then add)
    mode "huginn": r = rms(residual + sub; post_weight)      (add, then norm the sum)
    n = rms(r; next_weight) when next_weight is given.
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
