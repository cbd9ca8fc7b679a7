"""FP8 forms of the models' linear layers (``quantization="fp8"`` and ``"w8a8_fp8"``).

`linear_weight` turns a loaded weight [N, K] into what the models hand to ``ops.linear``: the
tensor itself, or an `Fp8Weight` (float8_e4m3fn data and per-output-channel fp32 scales,
quantized once at load by `rlt_kernels.fp8.quantize_weight_fp8`). Only the transformer layers'
linears are quantized (Ouro q/k/v, o, gate/up, down; Huginn Wqkv, proj, fc, mlp proj and the
adapter); embeddings, the LM head and Ouro's exit gate keep the model dtype.

* "fp8" (W8A16): the kernels widen the FP8 weight tiles and multiply them into 16-bit rows.
* "w8a8_fp8": the input rows are FP8 too (`Fp8Rows`: one power-of-two scale per row,
  `rlt_kernels.fp8_rows`), multiplied on the FP8 tensor cores. A norm that feeds such a layer
  can write its output in that form directly (Ouro's norms do); any other input is quantized by
  `quantize_rows` right before the layer (`linear_operands`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rlt_kernels.fp8 import quantize_weight_fp8
from rlt_kernels.fp8_rows import empty_rows

FP8_QUANTIZATIONS = ("fp8", "w8a8_fp8")


@dataclass(frozen=True)
class Fp8Weight:
    """data: float8_e4m3fn [N, K]; scale: fp32 [N] (row n of the weight is data[n] * scale[n]);
    w8a8: whether the layer takes FP8 input rows."""

    data: torch.Tensor
    scale: torch.Tensor
    w8a8: bool = False

    @property
    def shape(self) -> torch.Size:
        return self.data.shape


@dataclass(frozen=True)
class Fp8Rows:
    """Input rows of a W8A8 layer: data float8_e4m3fn [M, K], scale fp32 [M] (row m is
    data[m] * scale[m]); dtype: the rows' unquantized dtype, which the layer's output takes."""

    data: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @classmethod
    def empty_like(cls, x: torch.Tensor) -> "Fp8Rows":
        """Uninitialised FP8 rows standing for x [M, K]."""
        return cls(*empty_rows(x), x.dtype)


def linear_weight(weight: torch.Tensor, quantization: Optional[str]):
    """The weight as the model stores it: unchanged (None) or quantized per output channel
    ("fp8", "w8a8_fp8")."""
    if quantization is None:
        return weight
    data, scale = quantize_weight_fp8(weight)
    return Fp8Weight(data, scale, w8a8=quantization == "w8a8_fp8")


def linear_operands(x, weight, quantize_rows, active_rows=None) -> tuple:
    """(x, weight, weight_scale, x_scale, out_dtype) for a kernel-level linear from the models'
    forms: x a tensor or `Fp8Rows`, weight a tensor or `Fp8Weight`; out_dtype is what the model
    expects back (x's dtype, or the rows' unquantized one). A W8A8 weight's unquantized input is
    quantized here with ``quantize_rows`` (the namespace's op)."""
    weight_scale = x_scale = None
    if isinstance(weight, Fp8Weight):
        if weight.w8a8 and not isinstance(x, Fp8Rows):
            x = Fp8Rows(*quantize_rows(x, active_rows=active_rows), x.dtype)
        weight, weight_scale = weight.data, weight.scale
    out_dtype = x.dtype
    if isinstance(x, Fp8Rows):
        if weight_scale is None:
            raise ValueError("FP8 input rows need a W8A8 weight (quantization='w8a8_fp8')")
        x, x_scale = x.data, x.scale
    return x, weight, weight_scale, x_scale, out_dtype


def output_rows(out) -> tuple:
    """(tensor, scale) a norm kernel writes for ``out``: an `Fp8Rows`' two tensors, or (out, None)."""
    if isinstance(out, Fp8Rows):
        return out.data, out.scale
    return out, None
