"""FP8 weights: per-channel quantization and the batch-invariant `linear` reading FP8 weights.

The Triton interpreter loads float8_e4m3fn tensors and widens them like the GPU does, so the
kernel's FP8 path runs here as written (no separate CPU path). The oracle is fp64 math on the
dequantized weight (every e4m3 value times its fp32 scale is exact in fp64).
"""

import pytest
import torch

from rlt_kernels import gemm
from rlt_kernels.fp8 import FP8_DTYPE, FP8_MAX, dequantize_weight_fp8, quantize_weight_fp8

from checks import assert_same_bits, randn, seeded


def _exact(x, w8, scale, activation):
    """fp64 x @ (w8 * scale).T (+ SwiGLU) straight from the definition."""
    acc = x.double() @ (w8.double() * scale.double()[:, None]).T
    if activation == "swiglu":
        f = w8.shape[0] // 2
        gate, up = acc[:, :f], acc[:, f:]
        return gate * torch.sigmoid(gate) * up
    return acc


def _weight(n, k, device, seed):
    """A weight whose rows have very different magnitudes (so a wrong or swapped scale shows)."""
    gen = seeded(seed, device)
    rows = torch.logspace(-2, 1, n, device=device)[torch.randperm(n, generator=gen, device=device)]
    return randn((n, k), torch.float32, device, gen, scale=k**-0.5) * rows[:, None]


def test_quantize_weight_per_channel(device):
    w = _weight(24, 40, device, 0)
    w[5] = 0.0
    w8, scale = quantize_weight_fp8(w.bfloat16())
    assert w8.dtype == FP8_DTYPE and w8.shape == w.shape and scale.dtype == torch.float32 and scale.shape == (24,)
    amax = w.bfloat16().float().abs().amax(1)
    assert scale[5] == 1.0 and not w8[5].float().any()
    live = amax > 0
    # amax / 448 correctly rounded (the fp64 quotient rounded to fp32 is), on every device alike: a
    # multiplication by the reciprocal, which CUDA does for a scalar divisor, rounds about half the rows
    # differently, so weights quantized on the host and on the GPU would differ.
    assert torch.equal(scale[live], (amax[live].double() / FP8_MAX).float())
    # Each row's largest element maps to the top of the range; e4m3 rounds to 3 mantissa bits.
    assert (w8.float().abs().amax(1)[live] == FP8_MAX).all()
    back = dequantize_weight_fp8(w8, scale)
    err = (back - w.bfloat16().float()).abs()
    assert (err <= 2.0**-4 * w.bfloat16().float().abs() + scale[:, None] * 2.0**-9).all()


def test_quantize_clamps_instead_of_overflowing(device):
    w8, scale = quantize_weight_fp8(torch.tensor([[1.0, -3.0, 2.5]], device=device))
    assert torch.isfinite(w8.float()).all() and w8.float().abs().max() == FP8_MAX


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("activation", [None, "swiglu"])
@pytest.mark.parametrize("m,n,k", [(1, 40, 72), (5, 96, 200), (3, 34, 4160)])  # the last splits K
def test_fp8_linear_matches_reference_and_fp64(device, x_dtype, activation, m, n, k):
    x = randn((m, k), x_dtype, device, seeded(m + n + k, device))
    w8, scale = quantize_weight_fp8(_weight(n, k, device, n + k))
    n_out = n // 2 if activation == "swiglu" else n
    out = gemm.linear(x, w8, weight_scale=scale, activation=activation,
                      out=torch.full((m, n_out), float("nan"), dtype=torch.float32, device=device))
    ref = gemm.linear_reference(x, w8, weight_scale=scale, activation=activation,
                                out=torch.empty((m, n_out), dtype=torch.float32, device=device))
    exact = _exact(x, w8, scale, activation)
    bound = (x.double().abs() @ (w8.double().abs() * scale.double()[:, None]).T).max().item()
    atol = 4 * k * 2.0**-24 * bound * (bound if activation == "swiglu" else 1.0) + 1e-6
    torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=atol)
    torch.testing.assert_close(ref.double(), exact, rtol=1e-5, atol=atol)
    # Rounded to x's dtype by default.
    assert gemm.linear(x, w8, weight_scale=scale, activation=activation).dtype == x_dtype


@pytest.mark.parametrize("activation", [None, "swiglu"])
@pytest.mark.parametrize("k", [96, 4160])
def test_fp8_linear_is_batch_invariant(device, activation, k):
    """A row's bits alone equal its bits anywhere in a batch, and with a device-side row count."""
    n = 64
    gen = seeded(k, device)
    x = randn((19, k), torch.bfloat16, device, gen)
    w8, scale = quantize_weight_fp8(_weight(n, k, device, 7))
    batch = gemm.linear(x, w8, weight_scale=scale, activation=activation)
    for row in (0, 7, 18):
        alone = gemm.linear(x[row : row + 1], w8, weight_scale=scale, activation=activation)
        assert_same_bits(alone[0], batch[row])
    active = torch.tensor([9], dtype=torch.int32, device=device)
    n_out = batch.shape[1]
    part = gemm.linear(x, w8, weight_scale=scale, activation=activation, active_rows=active,
                       out=torch.full((19, n_out), float("nan"), dtype=torch.bfloat16, device=device))
    assert_same_bits(part[:9], batch[:9])
    assert torch.isnan(part[9:]).all()
    # The reference is row-invariant too.
    ref = gemm.linear_reference(x, w8, weight_scale=scale, activation=activation)
    assert_same_bits(gemm.linear_reference(x[7:8], w8, weight_scale=scale, activation=activation)[0], ref[7])


def test_fp8_linear_argument_errors(device):
    x = torch.zeros((2, 32), dtype=torch.bfloat16, device=device)
    w8, scale = quantize_weight_fp8(torch.ones((8, 32), device=device))
    for fn in (gemm.linear, gemm.linear_reference):
        with pytest.raises(ValueError, match=r"needs weight_scale: a contiguous fp32 tensor \[8\]"):
            fn(x, w8)
        with pytest.raises(ValueError, match=r"needs weight_scale"):
            fn(x, w8, weight_scale=scale[:4])
        with pytest.raises(ValueError, match="weight_scale is for float8_e4m3fn weights"):
            fn(x, torch.ones((8, 32), dtype=torch.bfloat16, device=device), weight_scale=scale)


OURO_LAYER_WEIGHTS = [(6144, 2048, None), (2048, 2048, None), (11264, 2048, "swiglu"), (2048, 5632, None)]
# ouro-tiny's and huginn-tiny's layer shapes (the conformance matrix's models): one K step, narrow
# tiles, so launches of 17-64 rows take the untransposed 64-row tile where up to 16 rows take the
# transposed one (the matrix's c018 once gave a crowd other bits than a request alone, on the GPU).
TINY_LAYER_WEIGHTS = [(128, 64, None), (64, 64, None), (256, 64, "swiglu"), (64, 128, None)]


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,activation", OURO_LAYER_WEIGHTS + TINY_LAYER_WEIGHTS)
def test_gpu_fp8_row_classes_keep_the_bits(device, n, k, activation):
    """Ouro-1.4B's and the tiny presets' layer shapes: a row's bits are the same in the decode,
    middle and prefill row classes (their tiles differ, their reduction plan does not), and close
    to the reference."""
    gen = seeded(n + k, device)
    w8, scale = quantize_weight_fp8(_weight(n, k, device, n))
    x = randn((1100, k), torch.bfloat16, device, gen)
    full = gemm.linear(x, w8, weight_scale=scale, activation=activation)
    ref = gemm.linear_reference(x, w8, weight_scale=scale, activation=activation)
    torch.testing.assert_close(full.float(), ref.float(), rtol=2 * 2.0**-7, atol=2e-2)
    for m in (1, 5, 16, 17, 24, 64, 65, 300):
        assert torch.equal(gemm.linear(x[:m], w8, weight_scale=scale, activation=activation), full[:m]), \
            f"row bits changed at M={m}"
