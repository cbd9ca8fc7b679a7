"""Batch-invariant linear layer: ``out = x @ weight.T`` with an optional fused SwiGLU.

Contract shared by the Triton kernel and the torch reference:

* x [M, K] (bf16/fp16/fp32; fp64 reference only), weight [N, K] row-major (the nn.Linear
  layout), fp32 accumulation, result rounded to ``out.dtype`` (default x.dtype; pass an fp32
  ``out`` for fp32 logits or gate scores).
* ``activation="swiglu"``: weight is [2F, K] = [gate rows | up rows]; out [M, F] =
  silu(x @ gate.T) * (x @ up.T), computed from the fp32 accumulators and rounded once.
* Batch invariance: a row's output bits do not depend on M, on the other rows or on the row's
  position. The kernel uses one tile configuration per weight shape (never chosen from M) and
  no split-K.
* ``active_rows`` (int32 [1] on the device): rows at or past the count are not written and
  their tiles are skipped inside the kernel, so a CUDA graph captured at a large bucket only
  pays for the live rows.
"""

from __future__ import annotations

import torch

from ._rows import active_count, by_row_chunks, compute_dtype


def _matmul_rows(x, weight, activation):
    cd = compute_dtype(x.dtype)
    acc = x.to(cd) @ weight.to(cd).T
    if activation == "swiglu":
        f = weight.shape[0] // 2
        acc = torch.nn.functional.silu(acc[:, :f]) * acc[:, f:]
    return acc


def linear_reference(x, weight, *, out=None, active_rows=None, activation=None):
    """Torch reference of `linear` (row-invariant on CPU and GPU)."""
    if activation not in (None, "swiglu"):
        raise ValueError(f"activation must be None or 'swiglu', got {activation!r}")
    n = weight.shape[0] // 2 if activation == "swiglu" else weight.shape[0]
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device) if out is None else out
    m = active_count(active_rows, x.shape[0])
    if m:
        out[:m] = by_row_chunks(_matmul_rows, x[:m], weight, activation).to(out.dtype)
    return out
