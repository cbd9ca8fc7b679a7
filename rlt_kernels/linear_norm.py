"""A linear layer feeding a residual norm: ``residual_norm(x @ weight.T, residual, ...)`` in one call.

Where the weight's reduction plan splits K, the residual-norm kernel adds the linear's fp32
partials itself (`gemm.linear_partials`, `SplitPartials`): one launch fewer per call and no
round trip of the linear's output through memory, with the bits of `residual_norm(linear(...))`.
Otherwise the two kernels run as they would separately.
"""

from __future__ import annotations

import torch

from .gemm import linear_partials, linear_reference
from .norms import residual_norm, residual_norm_reference


def linear_residual_norm(x, weight, residual, post_weight, next_weight, eps, *, mode="ouro", residual_out=None,
                         normed_out=None, active_rows=None, weight_scale=None, x_scale=None, normed_scale=None):
    """`norms.residual_norm(gemm.linear(x, weight), residual, ...)` (Triton), fused where K splits.

    x [M, K], or float8_e4m3fn rows with x_scale fp32 [M] (W8A8); weight [N, K] in x.dtype, or
    float8_e4m3fn with weight_scale fp32 [N]; residual [M, N] (the linear's output dtype); the rest as
    `residual_norm` (normed_out may be float8_e4m3fn with normed_scale). Returns (r, n) like
    `residual_norm`."""
    sub = linear_partials(x, weight, active_rows=active_rows, weight_scale=weight_scale, x_scale=x_scale,
                          out_dtype=residual.dtype)
    return residual_norm(sub, residual, post_weight, next_weight, eps, mode=mode, residual_out=residual_out,
                         normed_out=normed_out, active_rows=active_rows, normed_scale=normed_scale)


def linear_residual_norm_reference(x, weight, residual, post_weight, next_weight, eps, *, mode="ouro",
                                   residual_out=None, normed_out=None, active_rows=None, weight_scale=None,
                                   x_scale=None, normed_scale=None):
    """Torch reference of `linear_residual_norm`: the two references one after the other."""
    sub = linear_reference(x, weight, active_rows=active_rows, weight_scale=weight_scale, x_scale=x_scale,
                           out=torch.empty((x.shape[0], weight.shape[0]), dtype=residual.dtype, device=x.device))
    return residual_norm_reference(sub, residual, post_weight, next_weight, eps, mode=mode,
                                   residual_out=residual_out, normed_out=normed_out, active_rows=active_rows,
                                   normed_scale=normed_scale)
