"""Triton norms, SwiGLU and RoPE against their torch references and against plain fp64 math.

Runs under the Triton interpreter on CPU (small shapes) and on CUDA; `gpu` tests add the real
Ouro / Huginn widths in bf16.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlt_kernels import norms

from checks import randn, seeded

EPS = 1e-6
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _tol(dtype: torch.dtype) -> float:
    """Two units in the last place: fp32 results are near exact; 16-bit ones carry the
    contract's intermediate roundings (normalised value, residual add)."""
    return {torch.float32: 1e-5, torch.bfloat16: 2 * 2.0**-7, torch.float16: 2 * 2.0**-10}[dtype]


def _assert_near(actual, expected, dtype):
    """Elementwise relative tolerance, plus an absolute one at the tensor's scale: roundings of
    intermediates happen at operand magnitude, so a sum that cancels keeps their absolute error."""
    expected = expected.double()
    tol = _tol(dtype)
    torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=tol * max(1.0, expected.abs().max().item()))


def _assert_rounds_like(out, ref, device):
    """Kernel and reference round the same fp32 values (up to the order of the row sum), so
    nearly every element must be bit-identical. Checked where the casts round to nearest: fp16
    everywhere, bf16 on CUDA (the CPU interpreter truncates fp32 -> bf16)."""
    if out.dtype == torch.float16 or (out.dtype == torch.bfloat16 and device.type == "cuda"):
        assert (out == ref).float().mean().item() >= 0.97


def _poison(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _assert_rows_written(out, live):
    """Rows below `live` hold numbers; rows at or past it still hold the NaN poison."""
    assert not torch.isnan(out[:live]).any(), "a live row was not written"
    assert torch.isnan(out[live:]).all(), "a row past the active count was written"


def _rms64(x, w):
    """Plain fp64 RMSNorm (no intermediate rounding)."""
    xd = x.double()
    return xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + EPS) * w.double()


# ------------------------------------------------------------------------------------- RMSNorm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,width", [(1, 7), (3, 100), (17, 64), (2, 5280)])
def test_rms_norm_matches_reference_and_fp64(device, dtype, m, width):
    gen = seeded(m * 1000 + width, device)
    x = randn((m, width), dtype, device, gen, scale=3.0)
    w = randn((width,), dtype, device, gen).abs() + 0.5
    out = norms.rms_norm(x, w, EPS, out=_poison((m, width), dtype, device))
    assert out.dtype == dtype
    ref = norms.rms_norm_reference(x, w, EPS)
    _assert_near(out, ref, dtype)
    _assert_rounds_like(out, ref, device)
    _assert_near(out, _rms64(x, w), dtype)
    if dtype == torch.float32:
        torch.testing.assert_close(out, norms.rms_norm_reference(x, w, EPS), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("live", [0, 1, 5, 9])
def test_rms_norm_active_rows_and_poison(device, live):
    gen = seeded(live, device)
    x = randn((6, 40), torch.bfloat16, device, gen)
    w = randn((40,), torch.bfloat16, device, gen)
    out = norms.rms_norm(x, w, EPS, out=_poison((6, 40), torch.bfloat16, device),
                         active_rows=torch.tensor([live], dtype=torch.int32, device=device))
    n = min(live, 6)
    _assert_rows_written(out, n)
    assert torch.equal(out[:n], norms.rms_norm(x, w, EPS)[:n])


def test_rms_norm_strided_rows(device):
    gen = seeded(7, device)
    wide = randn((5, 96), torch.bfloat16, device, gen)
    x = wide[:, 16:16 + 72]
    w = randn((72,), torch.bfloat16, device, gen)
    out_wide = _poison((5, 80), torch.bfloat16, device)
    norms.rms_norm(x, w, EPS, out=out_wide[:, :72])
    assert torch.equal(out_wide[:, :72], norms.rms_norm(x.contiguous(), w, EPS))
    assert torch.isnan(out_wide[:, 72:]).all()


def test_rms_norm_fp32_weight_on_bf16_rows(device):
    """The weight is rounded to x.dtype before the multiply, as in the reference."""
    gen = seeded(3, device)
    x = randn((3, 48), torch.bfloat16, device, gen)
    w = randn((48,), torch.float32, device, gen)
    _assert_near(norms.rms_norm(x, w, EPS), norms.rms_norm_reference(x, w, EPS), torch.bfloat16)


# ------------------------------------------------------------------------------ residual norm


def _residual64(sub, res, post_w, next_w, mode):
    """fp64 sandwich update, rounding only where the contract rounds (to compare in fp32)."""
    if mode == "ouro":
        r = res.double() + _rms64(sub, post_w)
    else:
        r = _rms64(res.double() + sub.double(), post_w)
    return r, (None if next_w is None else _rms64(r, next_w))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["ouro", "huginn"])
@pytest.mark.parametrize("with_next", [False, True])
def test_residual_norm_matches_reference_and_fp64(device, dtype, mode, with_next):
    m, width = 5, 136
    gen = seeded(11, device)
    sub = randn((m, width), dtype, device, gen, scale=4.0)
    res = randn((m, width), dtype, device, gen)
    post_w = randn((width,), dtype, device, gen).abs() + 0.5
    next_w = (randn((width,), dtype, device, gen).abs() + 0.5) if with_next else None
    r, n = norms.residual_norm(
        sub, res, post_w, next_w, EPS, mode=mode, residual_out=_poison((m, width), dtype, device),
        normed_out=_poison((m, width), dtype, device) if with_next else None,
    )
    r_ref, n_ref = norms.residual_norm_reference(sub, res, post_w, next_w, EPS, mode=mode)
    r64, n64 = _residual64(sub, res, post_w, next_w, mode)
    _assert_near(r, r_ref, dtype)
    _assert_rounds_like(r, r_ref, device)
    _assert_near(r, r64, dtype)
    if with_next:
        _assert_near(n, n_ref, dtype)
        _assert_rounds_like(n, n_ref, device)
        _assert_near(n, n64, dtype)
    else:
        assert n is None


@pytest.mark.parametrize("mode", ["ouro", "huginn"])
def test_residual_norm_in_place_and_active_rows(device, mode):
    m, width, live = 7, 80, 4
    gen = seeded(5, device)
    sub = randn((m, width), torch.bfloat16, device, gen)
    res = randn((m, width), torch.bfloat16, device, gen)
    post_w = randn((width,), torch.bfloat16, device, gen)
    next_w = randn((width,), torch.bfloat16, device, gen)
    r_full, n_full = norms.residual_norm(sub, res, post_w, next_w, EPS, mode=mode)

    in_place = res.clone()
    normed = _poison((m, width), torch.bfloat16, device)
    active = torch.tensor([live], dtype=torch.int32, device=device)
    r, n = norms.residual_norm(sub, in_place, post_w, next_w, EPS, mode=mode, residual_out=in_place,
                               normed_out=normed, active_rows=active)
    assert r.data_ptr() == in_place.data_ptr() and n.data_ptr() == normed.data_ptr()
    assert torch.equal(in_place[:live], r_full[:live])
    assert torch.equal(in_place[live:], res[live:]), "rows past the active count must keep the old residual"
    assert torch.equal(normed[:live], n_full[:live])
    _assert_rows_written(normed, live)


def test_residual_norm_rejects_unknown_mode(device):
    x = torch.zeros((1, 8), device=device)
    with pytest.raises(ValueError, match="mode"):
        norms.residual_norm(x, x, x[0], None, EPS, mode="llama")


# ------------------------------------------------------------------------------------- SwiGLU


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,f", [(1, 7), (3, 1100), (17, 32)])
def test_swiglu_matches_reference_and_fp64(device, dtype, m, f):
    gen = seeded(m + f, device)
    gate_up = randn((m, 2 * f), dtype, device, gen, scale=3.0)
    out = norms.swiglu(gate_up, out=_poison((m, f), dtype, device))
    ref = norms.swiglu_reference(gate_up)
    _assert_near(out, ref, dtype)
    _assert_rounds_like(out, ref, device)
    g, u = gate_up[:, :f].double(), gate_up[:, f:].double()
    _assert_near(out, g * torch.sigmoid(g) * u, dtype)


def test_swiglu_active_rows_and_strided_input(device):
    gen = seeded(2, device)
    wide = randn((6, 70), torch.float16, device, gen)
    gate_up = wide[:, 2:66]
    out = norms.swiglu(gate_up, out=_poison((6, 32), torch.float16, device),
                       active_rows=torch.tensor([2], dtype=torch.int32, device=device))
    _assert_rows_written(out, 2)
    assert torch.equal(out[:2], norms.swiglu(gate_up.contiguous())[:2])


# ---------------------------------------------------------------------------------------- RoPE


def _rope64(x, positions, cos_sin, style, bias):
    """fp64 rotation built from complex pairs (an independent formulation of both styles)."""
    t, h, d = x.shape
    xd = x.double() + (0 if bias is None else bias.double())
    half = d // 2
    cs = cos_sin.double()[positions.long()]
    rot = torch.complex(cs[:, :half], cs[:, half:])[:, None, :]
    if style == "neox":
        z = torch.complex(xd[..., :half], xd[..., half:]) * rot
        return torch.cat([z.real, z.imag], dim=-1)
    z = torch.complex(xd[..., 0::2], xd[..., 1::2]) * rot
    return torch.stack([z.real, z.imag], dim=-1).reshape(t, h, d)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("head_dim,with_bias", [(64, False), (96, True), (128, False)])
def test_apply_rope_matches_reference_and_fp64(device, dtype, style, head_dim, with_bias):
    t, heads = 5, 3
    gen = seeded(head_dim, device)
    cos_sin = norms.rope_cos_sin(4096, head_dim, 50000.0 if style == "gptj" else 1e6, device=device)
    x = randn((t, heads, head_dim), dtype, device, gen)
    positions = torch.tensor([0, 1, 4095, 17, 1000], dtype=torch.int32, device=device)
    bias = randn((heads, head_dim), dtype, device, gen) if with_bias else None
    out = norms.apply_rope(x, positions, cos_sin, style=style, bias=bias, out=_poison(x.shape, dtype, device))
    ref = norms.apply_rope_reference(x, positions, cos_sin, style=style, bias=bias)
    _assert_near(out, ref, dtype)
    _assert_rounds_like(out, ref, device)
    _assert_near(out, _rope64(x, positions, cos_sin, style, bias), dtype)


def test_apply_rope_strided_in_place_and_active_rows(device):
    """q as a view into a fused qkv buffer, rotated in place; rows past the count untouched."""
    t, heads, d, live = 6, 2, 96, 4
    gen = seeded(9, device)
    qkv = randn((t, 3 * heads * d), torch.bfloat16, device, gen)
    cos_sin = norms.rope_cos_sin(64, d, 50000.0, device=device)
    positions = torch.arange(10, 10 + t, dtype=torch.int64, device=device)
    expected = norms.apply_rope(qkv[:, : heads * d].reshape(t, heads, d).contiguous(), positions, cos_sin, style="gptj")
    before = qkv.clone()
    q = qkv[:, : heads * d].view(t, heads, d)
    out = norms.apply_rope(q, positions, cos_sin, style="gptj", out=q,
                           active_rows=torch.tensor([live], dtype=torch.int32, device=device))
    assert out.data_ptr() == q.data_ptr()
    assert torch.equal(q[:live], expected[:live])
    assert torch.equal(qkv[live:], before[live:])
    assert torch.equal(qkv[:, heads * d:], before[:, heads * d:])


def test_rope_cos_sin_layout(device):
    table = norms.rope_cos_sin(8, 4, 10000.0, device=device)
    angle = torch.tensor([[p * 10000.0 ** (-2 * i / 4) for i in range(2)] for p in range(8)], dtype=torch.float64)
    torch.testing.assert_close(table.double().cpu(), torch.cat([angle.cos(), angle.sin()], 1), rtol=0, atol=1e-6)


# --------------------------------------------------------------------- batch invariance (bitwise)


def _row_views(seed, m, width, dtype, device):
    gen = seeded(seed, device)
    return randn((m, width), dtype, device, gen, scale=2.0), gen


@settings(max_examples=15)
@given(m=st.integers(2, 12), width=st.sampled_from([24, 136, 300]), pad=st.integers(1, 5),
       seed=st.integers(0, 2**16), dtype=st.sampled_from([torch.bfloat16, torch.float32]))
def test_norms_are_batch_invariant(device, m, width, pad, seed, dtype):
    """Each row's bits are identical alone, in the batch, permuted, and next to padding rows
    (garbage past the active count), for every norm kernel."""
    x, gen = _row_views(seed, m, width, dtype, device)
    sub = randn((m, width), dtype, device, gen)
    w1 = randn((width,), dtype, device, gen)
    w2 = randn((width,), dtype, device, gen)
    perm = torch.randperm(m, generator=torch.Generator().manual_seed(seed)).to(device)
    garbage = randn((pad, width), dtype, device, gen, scale=1e4)
    active = torch.tensor([m], dtype=torch.int32, device=device)

    def run(xs, subs, active_rows=None):
        r_o, n_o = norms.residual_norm(subs, xs, w1, w2, EPS, mode="ouro", active_rows=active_rows)
        r_h, n_h = norms.residual_norm(subs, xs, w1, None, EPS, mode="huginn", active_rows=active_rows)
        return [norms.rms_norm(xs, w1, EPS, active_rows=active_rows), r_o, n_o, r_h,
                norms.swiglu(torch.cat([xs, subs], 1), active_rows=active_rows)]

    full = run(x, sub)
    for got, want in zip(run(x[perm], sub[perm]), full):
        assert torch.equal(got, want[perm])
    padded = run(torch.cat([x, garbage]), torch.cat([sub, garbage]), active_rows=active)
    for got, want in zip(padded, full):
        assert torch.equal(got[:m], want)
    row = m // 2
    for got, want in zip(run(x[row:row + 1], sub[row:row + 1]), full):
        assert torch.equal(got[0], want[row])


@settings(max_examples=10)
@given(t=st.integers(2, 9), seed=st.integers(0, 2**16), style=st.sampled_from(["neox", "gptj"]))
def test_apply_rope_is_batch_invariant(device, t, seed, style):
    gen = seeded(seed, device)
    x = randn((t, 3, 96), torch.bfloat16, device, gen)
    bias = randn((3, 96), torch.bfloat16, device, gen)
    positions = torch.randint(0, 512, (t,), generator=torch.Generator().manual_seed(seed)).to(device)
    cos_sin = norms.rope_cos_sin(512, 96, 50000.0, device=device)
    full = norms.apply_rope(x, positions, cos_sin, style=style, bias=bias)
    perm = torch.randperm(t, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    assert torch.equal(norms.apply_rope(x[perm], positions[perm], cos_sin, style=style, bias=bias), full[perm])
    alone = norms.apply_rope(x[-1:], positions[-1:], cos_sin, style=style, bias=bias)
    assert torch.equal(alone[0], full[-1])


# ----------------------------------------------------------------------------------- validation


def test_kernels_reject_fp64_and_bad_shapes(device):
    x = torch.zeros((2, 8), dtype=torch.float64, device=device)
    with pytest.raises(ValueError, match="fp64"):
        norms.rms_norm(x, x[0], EPS)
    with pytest.raises(ValueError, match="weight"):
        norms.rms_norm(x.float(), torch.ones(7, device=device), EPS)
    with pytest.raises(ValueError, match="even"):
        norms.swiglu(torch.zeros((2, 7), device=device))
    with pytest.raises(ValueError, match="style"):
        norms.apply_rope(torch.zeros((1, 1, 8), device=device), torch.zeros(1, dtype=torch.int32, device=device),
                         norms.rope_cos_sin(4, 8, 10.0, device=device), style="rotate")
    with pytest.raises(ValueError, match=str(norms.MAX_NORM_WIDTH)):
        norms.rms_norm(torch.zeros((1, norms.MAX_NORM_WIDTH + 1), device=device),
                       torch.zeros(norms.MAX_NORM_WIDTH + 1, device=device), EPS)


# ---------------------------------------------------------------------------------- GPU (H200)


@pytest.mark.gpu
@pytest.mark.parametrize("width", [2048, 5280])
@pytest.mark.parametrize("mode", ["ouro", "huginn"])
def test_gpu_model_widths_bf16(device, width, mode):
    m = 4096
    gen = seeded(width, device)
    x = randn((m, width), torch.bfloat16, device, gen, scale=5.0)
    sub = randn((m, width), torch.bfloat16, device, gen, scale=20.0)
    w1 = randn((width,), torch.bfloat16, device, gen).abs() + 0.5
    w2 = randn((width,), torch.bfloat16, device, gen).abs() + 0.5
    _assert_near(norms.rms_norm(x, w1, EPS), norms.rms_norm_reference(x, w1, EPS), torch.bfloat16)
    r, n = norms.residual_norm(sub, x, w1, w2, EPS, mode=mode)
    r_ref, n_ref = norms.residual_norm_reference(sub, x, w1, w2, EPS, mode=mode)
    _assert_near(r, r_ref, torch.bfloat16)
    _assert_near(n, n_ref, torch.bfloat16)
    _assert_rounds_like(r, r_ref, device)
    _assert_rounds_like(n, n_ref, device)
    # Bitwise batch invariance at the real width: first rows alone vs in the 4096-row batch.
    r1, n1 = norms.residual_norm(sub[:3], x[:3], w1, w2, EPS, mode=mode)
    assert torch.equal(r1, r[:3]) and torch.equal(n1, n[:3])


@pytest.mark.gpu
@pytest.mark.parametrize("style,heads,head_dim,theta", [("neox", 16, 128, 1e6), ("gptj", 55, 96, 50000.0)])
def test_gpu_rope_model_shapes(device, style, heads, head_dim, theta):
    t = 2048
    gen = seeded(heads, device)
    x = randn((t, heads, head_dim), torch.bfloat16, device, gen)
    bias = randn((heads, head_dim), torch.bfloat16, device, gen) if style == "gptj" else None
    positions = torch.randint(0, 4096, (t,), device=device, generator=gen)
    cos_sin = norms.rope_cos_sin(4096, head_dim, theta, device=device)
    out = norms.apply_rope(x, positions, cos_sin, style=style, bias=bias)
    ref = norms.apply_rope_reference(x, positions, cos_sin, style=style, bias=bias)
    _assert_near(out, ref, torch.bfloat16)
    _assert_rounds_like(out, ref, device)
