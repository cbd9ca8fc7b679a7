"""W8A8: FP8 input rows (`fp8_rows.quantize_rows`, the norms writing FP8 rows) and the `linear`
kernel multiplying FP8 rows by FP8 weights.

The oracle is fp64 math on the dequantized operands (an e4m3 value times a power-of-two row scale,
or times its fp32 channel scale, is exact in fp64); quantization is checked bit for bit against
torch's own fp32 -> float8_e4m3fn conversion.
"""

import pytest
import torch

from rlt_kernels import gemm, norms
from rlt_kernels.fp8 import FP8_DTYPE, quantize_weight_fp8
from rlt_kernels.fp8_rows import quantize_rows, quantize_rows_reference, row_scales_reference
from rlt_kernels.linear_norm import linear_residual_norm, linear_residual_norm_reference

from checks import assert_same_bits, linear_weight, randn, seeded


def _rows(m, k, dtype, device, seed):
    """Rows of very different magnitudes, with an all-zero row, values far below their row's
    largest (e4m3 subnormals and negative values that round to -0) and exact rounding ties."""
    gen = seeded(seed, device)
    x = randn((m, k), torch.float32, device, gen) * torch.logspace(-20, 8, m, device=device)[:, None]
    x[1] = 0.0
    x[2, :4] = torch.tensor([1.0, 2.0**-12, -(2.0**-17), -(2.0**-19)], device=device)  # scaled: 2^-5, -2^-10, -2^-12
    x[3, :3] = torch.tensor([200.0, 84.0, -100.0], device=device)  # 84 and -100 are ties on e4m3's grid below 128
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantize_rows_matches_torch_bit_for_bit(device, dtype):
    x = _rows(6, 300, dtype, device, 1)
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    q, scale = quantize_rows(x)
    rq, rscale = quantize_rows_reference(x)
    assert q.dtype == FP8_DTYPE and scale.dtype == torch.float32
    assert_same_bits(q, rq)
    assert_same_bits(scale, rscale)
    amax = x.float().abs().amax(1)
    live = amax > 0
    assert scale[1] == 1.0 and not q[1].float().any()
    # Scales are powers of two placing each row's largest value in [128, 256).
    assert (torch.frexp(scale)[0] == 0.5).all()
    top = amax[live] / scale[live]
    assert ((top >= 128) & (top < 256)).all()
    assert (q[2, 2:4].view(torch.uint8) == 0x80).all()  # negative values that round to zero keep their sign
    assert q[3, 1].float() * scale[3] == 80.0 and q[3, 2].float() * scale[3] == -96.0  # ties to even
    assert (q.float() * scale[:, None] - x.float()).abs().le(x.float().abs().amax(1, keepdim=True) * 2.0**-4).all()


def test_row_scale_rule():
    amax = torch.tensor([0.0, 1.0, 1.99, 2.0, 2.0**-130, 3e38])
    assert row_scales_reference(amax).tolist() == [1.0, 2.0**-7, 2.0**-7, 2.0**-6, 2.0**-126, 2.0**120]


def test_quantize_rows_active_rows_and_errors(device):
    x = _rows(5, 40, torch.bfloat16, device, 2)
    active = torch.tensor([3], dtype=torch.int32, device=device)
    for fn in (quantize_rows, quantize_rows_reference):
        q = torch.full((5, 40), 0x7F, dtype=torch.uint8, device=device).view(FP8_DTYPE)
        scale = torch.full((5,), -1.0, device=device)
        fn(x, out=q, out_scale=scale, active_rows=active)
        full_q, full_scale = quantize_rows_reference(x)
        assert_same_bits(q[:3], full_q[:3])
        assert (q[3:].view(torch.uint8) == 0x7F).all() and (scale[3:] == -1).all()
    with pytest.raises(ValueError, match=r"out_scale: a contiguous fp32 tensor \[5\]"):
        quantize_rows(x, out=torch.empty((5, 40), dtype=FP8_DTYPE, device=device), out_scale=torch.empty(4, device=device))
    with pytest.raises(ValueError, match="x must be a bf16/fp16/fp32"):
        quantize_rows(x.double())


def _exact(xq, xs, w8, ws, activation):
    """fp64 (xq * xs) @ (w8 * ws).T (+ SwiGLU) straight from the definition."""
    acc = (xq.double() * xs.double()[:, None]) @ (w8.double() * ws.double()[:, None]).T
    if activation == "swiglu":
        f = w8.shape[0] // 2
        gate, up = acc[:, :f], acc[:, f:]
        return gate * torch.sigmoid(gate) * up
    return acc


@pytest.mark.parametrize("activation", [None, "swiglu"])
@pytest.mark.parametrize("m,n,k", [(1, 40, 72), (5, 96, 200), (3, 34, 4160)])  # the last splits K
def test_w8a8_linear_matches_fp64(device, activation, m, n, k):
    gen = seeded(m + n + k, device)
    xq, xs = quantize_rows(randn((m, k), torch.bfloat16, device, gen) * 3)
    w8, ws = linear_weight(n, k, FP8_DTYPE, device, gen)
    n_out = n // 2 if activation == "swiglu" else n
    out = gemm.linear(xq, w8, weight_scale=ws, x_scale=xs, activation=activation,
                      out=torch.full((m, n_out), float("nan"), dtype=torch.float32, device=device))
    ref = gemm.linear_reference(xq, w8, weight_scale=ws, x_scale=xs, activation=activation,
                                out=torch.empty((m, n_out), dtype=torch.float32, device=device))
    exact = _exact(xq, xs, w8, ws, activation)
    bound = ((xq.double().abs() * xs.double()[:, None]) @ (w8.double().abs() * ws.double()[:, None]).T).max().item()
    atol = 4 * k * 2.0**-24 * bound * (bound if activation == "swiglu" else 1.0) + 1e-6
    torch.testing.assert_close(ref.double(), exact, rtol=1e-5, atol=atol)
    if device.type == "cuda":  # Hopper's FP8 tensor-core products accumulate in about 13 bits (seen: 2^-13.5 of bound)
        atol += 2.0**-11 * bound * (bound if activation == "swiglu" else 1.0)
    torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=atol)
    assert gemm.linear(xq, w8, weight_scale=ws, x_scale=xs, activation=activation).dtype == torch.bfloat16


@pytest.mark.parametrize("activation", [None, "swiglu"])
@pytest.mark.parametrize("k", [96, 4160])
def test_w8a8_linear_is_batch_invariant(device, activation, k):
    """A row's bits alone equal its bits anywhere in a batch, and with a device-side row count."""
    gen = seeded(k, device)
    xq, xs = quantize_rows(randn((19, k), torch.bfloat16, device, gen))
    w8, ws = linear_weight(64, k, FP8_DTYPE, device, gen)
    batch = gemm.linear(xq, w8, weight_scale=ws, x_scale=xs, activation=activation)
    for row in (0, 7, 18):
        alone = gemm.linear(xq[row:row + 1], w8, weight_scale=ws, x_scale=xs[row:row + 1], activation=activation)
        assert_same_bits(alone[0], batch[row])
    active = torch.tensor([9], dtype=torch.int32, device=device)
    part = gemm.linear(xq, w8, weight_scale=ws, x_scale=xs, activation=activation, active_rows=active,
                       out=torch.full(batch.shape, float("nan"), dtype=torch.bfloat16, device=device))
    assert_same_bits(part[:9], batch[:9])
    assert torch.isnan(part[9:]).all()


# Huginn's norm of residual + sub sees sub's scale; Ouro's rms(sub) would not notice a missing row scale.
@pytest.mark.parametrize("mode", ["huginn", "ouro"])
@pytest.mark.parametrize("k", [96, 4160])  # 4160 splits K: the norm adds the partials and applies the row scales
def test_norms_write_fp8_rows_as_quantize_rows_would(device, k, mode):
    n, m = 64, 7
    gen = seeded(k + 1, device)
    xq, xs = quantize_rows(randn((m, k), torch.bfloat16, device, gen))
    w8, ws = linear_weight(n, k, FP8_DTYPE, device, gen)
    residual = randn((m, n), torch.bfloat16, device, gen)
    post, nxt = (randn((n,), torch.bfloat16, device, gen) for _ in range(2))
    for fused, separate, quantize in ((linear_residual_norm, (gemm.linear, norms.residual_norm), quantize_rows),
                                      (linear_residual_norm_reference,
                                       (gemm.linear_reference, norms.residual_norm_reference), quantize_rows_reference)):
        q, scale = torch.empty((m, n), dtype=FP8_DTYPE, device=device), torch.empty(m, device=device)
        r, _ = fused(xq, w8, residual, post, nxt, 1e-6, mode=mode, weight_scale=ws, x_scale=xs, normed_out=q,
                     normed_scale=scale)
        sub = separate[0](xq, w8, weight_scale=ws, x_scale=xs)
        r2, n2 = separate[1](sub, residual, post, nxt, 1e-6, mode=mode)
        q2, scale2 = quantize(n2)
        exact = quantize is quantize_rows_reference or device.type != "cuda"
        _assert_same_rows(r, r2, exact)
        _assert_same_rows(q.float() * scale[:, None], q2.float() * scale2[:, None], exact)
    x = randn((m, n), torch.bfloat16, device, gen)
    for rms, quantize in ((norms.rms_norm, quantize_rows), (norms.rms_norm_reference, quantize_rows_reference)):
        q, scale = torch.empty((m, n), dtype=FP8_DTYPE, device=device), torch.empty(m, device=device)
        rms(x, nxt, 1e-6, out=q, out_scale=scale)
        q2, scale2 = quantize(rms(x, nxt, 1e-6))
        exact = quantize is quantize_rows_reference or device.type != "cuda"
        _assert_same_rows(q.float() * scale[:, None], q2.float() * scale2[:, None], exact)


def _assert_same_rows(a, b, exact):
    """Same bits; or, for the GPU's FP8-writing norms (their mean square may add its terms in another
    order, see rlt_kernels/norms.py), at most one step of the rounding grid apart (2^-3 of a value or
    of its row's largest) in at most 1% of the elements."""
    if exact:
        assert_same_bits(a, b)
        return
    a, b = a.float(), b.float()
    diff = (a - b).abs()
    assert (diff <= 2.0**-3 * torch.maximum(a.abs(), b.abs()) + 2.0**-7 * b.abs().amax(1, keepdim=True)).all()
    assert (diff > 0).float().mean() <= 0.01


def test_w8a8_argument_errors(device):
    xq, xs = quantize_rows(torch.ones((2, 32), dtype=torch.bfloat16, device=device))
    w8, ws = quantize_weight_fp8(torch.ones((8, 32), device=device))
    for fn in (gemm.linear, gemm.linear_reference):
        with pytest.raises(ValueError, match=r"needs x_scale: a contiguous fp32 tensor \[2\]"):
            fn(xq, w8, weight_scale=ws)
        with pytest.raises(ValueError, match="x_scale is for float8_e4m3fn x"):
            fn(xq.float(), w8, weight_scale=ws, x_scale=xs)
        with pytest.raises(ValueError, match="needs a float8_e4m3fn weight"):
            fn(xq, torch.ones((8, 32), device=device), x_scale=xs)
    with pytest.raises(ValueError, match=r"needs out_scale"):
        norms.rms_norm(torch.ones((2, 32), device=device), torch.ones(32, device=device), 1e-6,
                       out=torch.empty((2, 32), dtype=FP8_DTYPE, device=device))
    with pytest.raises(ValueError, match="out_scale is for a float8_e4m3fn out"):
        norms.rms_norm(torch.ones((2, 32), device=device), torch.ones(32, device=device), 1e-6,
                       out_scale=torch.empty(2, device=device))


OURO_LAYER_WEIGHTS = [(6144, 2048, None), (2048, 2048, None), (11264, 2048, "swiglu"), (2048, 5632, None)]


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,activation", OURO_LAYER_WEIGHTS)
def test_gpu_w8a8_row_classes_keep_the_bits(device, n, k, activation):
    """Ouro-1.4B's layer shapes: a row's bits are the same in every row class (decode, middle,
    prefill tiles), and close to the reference."""
    gen = seeded(n + k, device)
    w8, ws = linear_weight(n, k, FP8_DTYPE, device, gen)
    xq, xs = quantize_rows(randn((2048, k), torch.bfloat16, device, gen))
    full = gemm.linear(xq, w8, weight_scale=ws, x_scale=xs, activation=activation)
    ref = gemm.linear_reference(xq, w8, weight_scale=ws, x_scale=xs, activation=activation)
    torch.testing.assert_close(full.float(), ref.float(), rtol=2 * 2.0**-7, atol=2e-2)
    for m in (1, 5, 16, 17, 64, 65, 128, 256, 300, 384, 700):
        assert torch.equal(gemm.linear(xq[:m], w8, weight_scale=ws, x_scale=xs[:m], activation=activation), full[:m]), \
            f"row bits changed at M={m}"


OURO_DOWN = (2048, 5632)
EPS = 1e-6


@pytest.mark.parametrize("rows,in_tile", [(128, False), (200, True), (256, True), (300, False), (384, True),
                                          (512, True)])
def test_w8a8_middle_rows_of_down_add_their_ranges_in_the_tile(rows, in_tile):
    """W8A8 middle rows of a deep split weight (Ouro down) take a TMA tile that adds the K ranges
    itself wherever one fills the GPU's waves (no fp32 partials through memory), else the split
    tile; the K ranges stay the decode tile's. 16-bit rows keep their partials, and the switch
    turns it off."""
    n, k = OURO_DOWN
    cfg = gemm.linear_config(n, k, FP8_DTYPE, None, rows)
    decode = gemm.linear_config(n, k, FP8_DTYPE)
    assert cfg.tma and cfg.reduce_in_tile == in_tile and cfg.k_bounds(k) == decode.k_bounds(k)
    if rows == 256:
        assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages) == (64, 64, 256, 5)
    assert not gemm.linear_config(n, k, torch.bfloat16, None, rows).reduce_in_tile
    try:
        gemm.W8A8_MIDDLE_IN_TILE = False
        gemm.linear_config.cache_clear()
        assert not gemm.linear_config(n, k, FP8_DTYPE, None, rows).reduce_in_tile
    finally:
        gemm.W8A8_MIDDLE_IN_TILE = True
        gemm.linear_config.cache_clear()


def test_w8a8_ranges_added_in_the_tile_keep_the_bits_of_the_partials(device):
    """The tile that adds a split weight's K ranges itself (Ouro down's tile at 256 rows) gives the
    residual norm the bits of the split tile's fp32 partials, added by the norm: rows of two row
    tiles (the second ragged), FP8 weight and row scales, the next norm writing FP8 rows."""
    m, n, k = 70, 64, gemm.SPLIT_MIN_K
    gen = seeded(k + m, device)
    w8, ws = linear_weight(n, k, FP8_DTYPE, device, gen)
    xq, xs = quantize_rows(randn((m, k), torch.bfloat16, device, gen))
    residual = randn((m, n), torch.bfloat16, device, gen)
    post_w, next_w = (randn((n,), torch.bfloat16, device, gen) + 1 for _ in range(2))
    split = gemm.linear_config(*OURO_DOWN, FP8_DTYPE, None, 300)
    in_tile = gemm.linear_config(*OURO_DOWN, FP8_DTYPE, None, 256)
    assert not split.reduce_in_tile and in_tile.reduce_in_tile
    outs = []
    for cfg in (split, in_tile):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
        sub = gemm._launch(xq, w8, out, None, None, cfg, ws, reduce=False, x_scale=xs)
        assert (sub is out) == cfg.reduce_in_tile  # the tile's finished output, or the partials
        nq, nscale = torch.empty((m, n), dtype=FP8_DTYPE, device=device), torch.empty(m, device=device)
        r, _ = norms.residual_norm(sub, residual, post_w, next_w, EPS, normed_out=nq, normed_scale=nscale)
        outs.append((r, nq.view(torch.uint8), nscale))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    torch.testing.assert_close(out.float(), gemm.linear_reference(xq, w8, weight_scale=ws, x_scale=xs).float(),
                               rtol=2 * 2.0**-7, atol=2e-2)
    # Range sums 2^24 (256 products 256 x 256) and 2 (two products 1 x 1 in different K steps of
    # the second range): 2^24 + 2 when the ranges are summed apart, 2^24 in one running sum.
    x = torch.zeros((3, k), device=device)
    w = torch.zeros((n, k), device=device)
    x[:, :256], w[:, :256] = 256.0, 256.0
    second = in_tile.k_bounds(k)[1]
    for at in (second, second + in_tile.block_k):
        x[:, at], w[:, at] = 1.0, 1.0
    ones = torch.ones(3, device=device), torch.ones(n, device=device)
    for cfg in (split, in_tile):
        out = gemm._launch(x.to(FP8_DTYPE), w.to(FP8_DTYPE), torch.full((3, n), float("nan"), device=device), None,
                           None, cfg, ones[1], x_scale=ones[0])
        assert torch.equal(out, torch.full_like(out, 2.0**24 + 2))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 64, 128, 256, 384, 1100])
def test_gpu_w8a8_fused_down_projection_keeps_the_bits(device, m):
    """Ouro-1.4B's down projection (2048 x 5632, split 4) with FP8 rows into its residual norm, the
    next norm writing FP8 rows, at every row class (partials at 128, ranges added in the tile at 256
    and 384): the fused call equals the two kernels bit for bit, and a row alone equals its batch."""
    n, k = OURO_DOWN
    gen = seeded(m, device)
    w8, ws = linear_weight(n, k, FP8_DTYPE, device, gen)
    xq, xs = quantize_rows(randn((m, k), torch.bfloat16, device, gen))
    residual = randn((m, n), torch.bfloat16, device, gen)
    post_w, next_w = (randn((n,), torch.bfloat16, device, gen) + 1 for _ in range(2))

    def fused(rows):
        q, scale = torch.empty((rows, n), dtype=FP8_DTYPE, device=device), torch.empty(rows, device=device)
        r, _ = linear_residual_norm(xq[:rows], w8, residual[:rows], post_w, next_w, EPS, weight_scale=ws,
                                    x_scale=xs[:rows], normed_out=q, normed_scale=scale)
        return r, q.view(torch.uint8), scale

    q, scale = torch.empty((m, n), dtype=FP8_DTYPE, device=device), torch.empty(m, device=device)
    r, _ = norms.residual_norm(gemm.linear(xq, w8, weight_scale=ws, x_scale=xs), residual, post_w, next_w, EPS,
                               normed_out=q, normed_scale=scale)
    got = fused(m)
    for a, b in zip(got, (r, q.view(torch.uint8), scale)):
        assert torch.equal(a, b)
    for a, b in zip(fused(1), got):
        assert torch.equal(a, b[:1])
