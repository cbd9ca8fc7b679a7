"""Helpers the kernel tests share: seeded inputs, bit-exact comparison, a chi-square p-value."""

import math

import numpy as np
import torch


def seeded(seed: int, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def randn(shape, dtype, device, generator, scale=1.0):
    return (torch.randn(shape, generator=generator, device=device) * scale).to(dtype)


def linear_weight(n, k, dtype, device, generator):
    """A random linear weight [n, k] (scale k^-1/2) in ``dtype``, or quantized per channel for
    float8_e4m3fn: returns (weight, fp32 scales [n] or None)."""
    from rlt_kernels.fp8 import FP8_DTYPE, quantize_weight_fp8

    w = randn((n, k), torch.float32, device, generator, scale=k**-0.5)
    return quantize_weight_fp8(w) if dtype == FP8_DTYPE else (w.to(dtype), None)


def bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view of a tensor's bits (NaN poison compares exactly)."""
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_same_bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    mismatch = (bits(actual) != bits(expected)).nonzero()
    assert mismatch.numel() == 0, f"{mismatch.shape[0]} elements differ, first at {mismatch[0].tolist()}"


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Upper-tail p-value of Pearson's statistic (Wilson-Hilferty normal approximation)."""
    expected = counts.sum() * probs
    stat = float(((counts - expected) ** 2 / expected).sum())
    dof = len(probs) - 1
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))
