"""linear_residual_norm: a linear feeding a residual norm, the norm adding split-K partials itself."""

import pytest
import torch

from rlt_kernels import gemm, linear_norm, norms
from rlt_kernels.fp8 import FP8_DTYPE
from rlt_kernels.split_partials import SplitPartials

from checks import linear_weight, randn, seeded

EPS = 1e-6


def _inputs(m, n, k, weight_dtype, device, seed):
    gen = seeded(seed, device)
    x = randn((m, k), torch.bfloat16, device, gen)
    w, scale = linear_weight(n, k, weight_dtype, device, gen)
    residual = randn((m, n), torch.bfloat16, device, gen)
    post_w = randn((n,), torch.bfloat16, device, gen) + 1
    next_w = randn((n,), torch.bfloat16, device, gen) + 1
    return x, w, scale, residual, post_w, next_w


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, FP8_DTYPE])
@pytest.mark.parametrize("mode", ["ouro", "huginn"])
@pytest.mark.parametrize("with_next", [True, False])
@pytest.mark.parametrize("k", [gemm.SPLIT_MIN_K, 40])  # a weight whose plan splits K, and one that does not
def test_fused_equals_linear_then_residual_norm(device, weight_dtype, mode, with_next, k):
    """Bit for bit `residual_norm(linear(x, w), ...)`, for split and unsplit weights, bf16 and FP8
    (its scale applied after the partials are added), both norm modes, in place, rows past the
    active count untouched; close to the torch reference."""
    m, n = 5, 24
    x, w, scale, residual, post_w, next_w = _inputs(m, n, k, weight_dtype, device, k + m)
    assert (gemm.linear_config(n, k, torch.bfloat16).split_k > 1) == (k >= gemm.SPLIT_MIN_K)
    nxt = next_w if with_next else None
    sub = gemm.linear(x, w, weight_scale=scale)
    want_r, want_n = norms.residual_norm(sub, residual, post_w, nxt, EPS, mode=mode)
    got_r, got_n = linear_norm.linear_residual_norm(x, w, residual, post_w, nxt, EPS, mode=mode, weight_scale=scale)
    assert torch.equal(got_r, want_r)
    assert (got_n is None) == (not with_next) and (got_n is None or torch.equal(got_n, want_n))

    in_place = residual.clone()
    active = torch.tensor([3], dtype=torch.int32, device=device)
    r, _ = linear_norm.linear_residual_norm(x, w, in_place, post_w, nxt, EPS, mode=mode, residual_out=in_place,
                                            active_rows=active, weight_scale=scale)
    assert r.data_ptr() == in_place.data_ptr()
    assert torch.equal(r[:3], want_r[:3]) and torch.equal(r[3:], residual[3:])

    ref_r, ref_n = linear_norm.linear_residual_norm_reference(x.float(), w.float() if scale is None else w,
                                                              residual.float(), post_w.float(),
                                                              None if nxt is None else nxt.float(), EPS, mode=mode,
                                                              weight_scale=scale)
    torch.testing.assert_close(got_r.float(), ref_r, rtol=0.05, atol=0.05)


def test_linear_partials_only_for_split_weights(device):
    """`linear_partials` hands back fp32 range sums where K splits (added in range order they are
    the linear's fp32 output), the finished output otherwise."""
    x, w, _, _, _, _ = _inputs(3, 24, gemm.SPLIT_MIN_K, torch.bfloat16, device, 1)
    parts = gemm.linear_partials(x, w)
    assert isinstance(parts, SplitPartials) and parts.splits == gemm.SPLIT_K and parts.shape == (3, 24)
    total = torch.zeros(3, 24, dtype=torch.float32, device=device)
    for s in range(parts.splits):
        total += parts.workspace[s]
    assert torch.equal(total, gemm.linear(x, w, out=torch.empty(3, 24, dtype=torch.float32, device=device)))
    x, w, _, _, _, _ = _inputs(3, 24, 40, torch.bfloat16, device, 2)
    assert torch.equal(gemm.linear_partials(x, w), gemm.linear(x, w))


def test_partials_must_match_the_residual(device):
    x, w, _, residual, post_w, _ = _inputs(3, 24, gemm.SPLIT_MIN_K, torch.bfloat16, device, 3)
    parts = gemm.linear_partials(x, w)
    with pytest.raises(ValueError, match="do not match the residual"):
        norms.residual_norm(parts, residual[:2], post_w, None, EPS)
    with pytest.raises(ValueError, match="do not match the residual"):
        norms.residual_norm(parts, residual.float(), post_w.float(), None, EPS)
    bad = SplitPartials(parts.workspace, torch.ones(5, device=device), torch.bfloat16)
    with pytest.raises(ValueError, match=r"scale must be fp32 \[24\]"):
        norms.residual_norm(bad, residual, post_w, None, EPS)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 256, 1100])
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, FP8_DTYPE])
def test_gpu_fused_down_projection_keeps_the_bits(device, m, weight_dtype):
    """Ouro-1.4B's down projection (2048 x 5632, split 4) into its residual norm, at every row
    class: the fused call equals the two kernels bit for bit."""
    x, w, scale, residual, post_w, next_w = _inputs(m, 2048, 5632, weight_dtype, device, m)
    want = norms.residual_norm(gemm.linear(x, w, weight_scale=scale), residual, post_w, next_w, EPS)
    got = linear_norm.linear_residual_norm(x, w, residual, post_w, next_w, EPS, weight_scale=scale)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
