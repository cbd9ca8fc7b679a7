"""FP8 linear weights of the models (``quantization="fp8"``).

`linear_weight` turns a loaded weight [N, K] into what the models hand to ``ops.linear``: the
tensor itself, or an `Fp8Weight` (float8_e4m3fn data and per-output-channel fp32 scales,
quantized once at load by `rlt_kernels.fp8.quantize_weight_fp8`). Only the transformer layers'
linears are quantized (Ouro q/k/v, o, gate/up, down; Huginn Wqkv, proj, fc, mlp proj and the
adapter); embeddings, the LM head and Ouro's exit gate keep the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rlt_kernels.fp8 import quantize_weight_fp8

@dataclass(frozen=True)
class Fp8Weight:
    """data: float8_e4m3fn [N, K]; scale: fp32 [N] (row n of the weight is data[n] * scale[n])."""

    data: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.data.shape


def linear_weight(weight: torch.Tensor, quantization: Optional[str]):
    """The weight as the model stores it: unchanged (None) or quantized per output channel ("fp8")."""
    if quantization is None:
        return weight
    data, scale = quantize_weight_fp8(weight)
    return Fp8Weight(data, scale)

