"""FP8 (e4m3) storage: the format, and quantization of linear weights and K/V values.

Both quantizations divide by an fp32 scale, clamp to the format's finite range (±448) and round
to nearest even; dequantization multiplies the fp8 value by the scale. Every e4m3 value is exactly
representable in bf16, fp16 and fp32, so widening a stored value never rounds.

* Linear weights: one scale per output channel (row of the [N, K] weight), amax / 448 (1 for an
  all-zero row), fixed at load time.
* K/V: one fp32 scale per (cache layer, KV head), fixed when the cache is allocated; the KV
  scatter kernels quantize on write and the attention kernels dequantize on read.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8 e4m3 of ``x / scale`` (fp32 division, clamped to ±448, round to nearest even).
    ``scale`` broadcasts against ``x`` (fp32)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_weight_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel FP8 of a linear weight [N, K] (any float dtype): returns the fp8
    weight [N, K] (contiguous, same device) and fp32 scales [N] (amax of the row / 448)."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be [N, K], got {tuple(weight.shape)}")
    amax = weight.detach().float().abs().amax(dim=1)
    # A true division on every device (CUDA multiplies by the reciprocal of a Python scalar divisor,
    # which rounds differently): weights quantized on the host and on the GPU get the same bits.
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    return quantize_fp8(weight.detach(), scale[:, None]).contiguous(), scale.contiguous()


def dequantize_weight_fp8(weight: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """weight [N, K] fp8 times scale [N] per row, in ``dtype``."""
    return (weight.float() * scale.float()[:, None]).to(dtype)


def check_kv_scales(k_cache: torch.Tensor, k_scale, v_scale) -> None:
    """A float8_e4m3fn cache [..., KVH, D] needs contiguous fp32 scales [KVH] for K and V; a cache
    in another dtype takes none. ValueError naming the argument otherwise."""
    fp8 = k_cache.dtype == FP8_DTYPE
    kvh = k_cache.shape[-2]
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not fp8 and t is not None:
            raise ValueError(f"{name} is for float8_e4m3fn caches, got a {k_cache.dtype} cache")
        if fp8 and (t is None or t.dtype != torch.float32 or tuple(t.shape) != (kvh,) or not t.is_contiguous()):
            got = None if t is None else f"{t.dtype} {tuple(t.shape)}"
            raise ValueError(f"a float8_e4m3fn cache needs {name}: a contiguous fp32 tensor [{kvh}] (one scale per "
                             f"KV head), got {got}")
