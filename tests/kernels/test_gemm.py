"""Batch-invariant `linear` (+ fused SwiGLU) against its torch reference and plain fp64 math.

Runs under the Triton interpreter on CPU (small shapes) and on CUDA; `gpu` tests add the Ouro /
Huginn weight shapes in bf16, CUDA-graph replay with a device-side row count, and bitwise
invariance at real sizes.
"""

import dataclasses
import pytest
import torch
import triton
from hypothesis import given, settings
from hypothesis import strategies as st

from rlt_kernels import gemm, norms
from rlt_kernels.fp8 import FP8_DTYPE

from checks import linear_weight, randn, seeded

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
EPS = {torch.float32: 2.0**-23, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def _poison(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _exact(x, weight, activation):
    """fp64 math straight from the definition."""
    acc = x.double() @ weight.double().T
    if activation == "swiglu":
        f = weight.shape[0] // 2
        gate, up = acc[:, :f], acc[:, f:]
        return gate * torch.sigmoid(gate) * up
    return acc


def _assert_close_to(out, expected, x, weight, activation):
    """Tolerance: rounding to out.dtype (2 ulp, relative) plus the fp32 accumulation error
    bound over K terms at the scale of sum_k |x_k w_k| (squared for swiglu's product)."""
    k = x.shape[1]
    scale = (x.double().abs() @ weight.double().abs().T).max().item()
    atol = 4 * k * 2.0**-24 * scale * (scale if activation == "swiglu" else 1.0) + 1e-6
    torch.testing.assert_close(out.double(), expected.double(), rtol=2 * EPS[out.dtype], atol=atol)


def _assert_rounds_like(out, ref, device):
    """Kernel and reference round the same fp32 value (up to accumulation order), so nearly every
    element must be bit-identical. Checked where the casts round to nearest: fp16 everywhere,
    bf16 on CUDA (the CPU interpreter truncates fp32 -> bf16)."""
    if out.dtype == torch.float16 or (out.dtype == torch.bfloat16 and device.type == "cuda"):
        assert (out == ref).float().mean().item() >= 0.97


def _assert_rows_written(out, live):
    assert not torch.isnan(out[:live]).any(), "a live row was not written"
    assert torch.isnan(out[live:]).all(), "a row past the active count was written"


# ------------------------------------------------------------------------------- correctness


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", [None, "swiglu"])
@pytest.mark.parametrize("m,n,k", [(1, 40, 72), (3, 96, 200), (17, 130, 64)])
def test_linear_matches_reference_and_fp64(device, dtype, activation, m, n, k):
    gen = seeded(m * n + k, device)
    x = randn((m, k), dtype, device, gen)
    w = randn((n, k), dtype, device, gen, scale=k**-0.5)
    n_out = n // 2 if activation == "swiglu" else n
    out = gemm.linear(x, w, activation=activation, out=_poison((m, n_out), dtype, device))
    assert out.shape == (m, n_out) and out.dtype == dtype
    ref = gemm.linear_reference(x, w, activation=activation)
    _assert_close_to(out, ref, x, w, activation)
    _assert_rounds_like(out, ref, device)
    _assert_close_to(out, _exact(x, w, activation), x, w, activation)


@pytest.mark.parametrize("activation", [None, "swiglu"])
def test_linear_fp32_output_from_bf16(device, activation):
    """An fp32 `out` keeps the fp32 accumulator (logits, exit-gate scores)."""
    gen = seeded(1, device)
    x = randn((5, 96), torch.bfloat16, device, gen)
    w = randn((66, 96), torch.bfloat16, device, gen)
    out = gemm.linear(x, w, activation=activation, out=_poison((5, 33 if activation else 66), torch.float32, device))
    expected = _exact(x, w, activation)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)
    ref = gemm.linear_reference(x, w, activation=activation, out=torch.empty_like(out))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", [None, "swiglu"])
def test_linear_wide_weight_config(device, activation):
    """Weights wide enough for the 128-column tile (and 8 warps with swiglu), ragged N and K."""
    n_out = gemm.WAVE_CTAS * 128 - 40  # too wide for one wave of 64-column tiles
    n = 2 * n_out if activation == "swiglu" else n_out
    cfg = gemm.linear_config(n, 48, torch.bfloat16, activation)
    assert cfg.block_n == 128
    gen = seeded(2, device)
    x = randn((3, 48), torch.bfloat16, device, gen)
    w = randn((n, 48), torch.bfloat16, device, gen, scale=0.2)
    out = gemm.linear(x, w, activation=activation)
    _assert_close_to(out, _exact(x, w, activation), x, w, activation)


def test_linear_fused_swiglu_equals_unfused(device):
    gen = seeded(3, device)
    x = randn((9, 80), torch.float16, device, gen)
    w = randn((2 * 48, 80), torch.float16, device, gen, scale=0.3)
    # With an fp32 intermediate the two paths do the same arithmetic: bitwise equal.
    fused32 = gemm.linear(x, w, activation="swiglu", out=torch.empty((9, 48), dtype=torch.float32, device=device))
    unfused32 = norms.swiglu(gemm.linear(x, w, out=torch.empty((9, 96), dtype=torch.float32, device=device)))
    assert torch.equal(fused32, unfused32)
    # The fused kernel rounds once, from the fp32 result (fp16 here: the CPU interpreter
    # truncates fp32 -> bf16 casts instead of rounding to nearest, real GPUs do not) ...
    fused = gemm.linear(x, w, activation="swiglu")
    assert torch.equal(fused, fused32.to(torch.float16))
    # ... while the unfused path also rounds the gate/up intermediate.
    unfused = norms.swiglu(gemm.linear(x, w))
    torch.testing.assert_close(fused.float(), unfused.float(), rtol=4 * EPS[torch.float16], atol=1e-3)


@pytest.mark.parametrize("live", [0, 1, 5, 64, 70, 99])
@pytest.mark.parametrize("activation", [None, "swiglu"])
def test_linear_active_rows_and_poison(device, live, activation):
    """Rows past the device-side count are never written; live rows match the full launch,
    including live rows inside a partially dead row tile."""
    m, n, k = 70, 40, 24
    gen = seeded(live, device)
    x = randn((m, k), torch.bfloat16, device, gen)
    w = randn((n, k), torch.bfloat16, device, gen)
    n_out = n // 2 if activation else n
    full = gemm.linear(x, w, activation=activation)
    out = gemm.linear(x, w, activation=activation, out=_poison((m, n_out), torch.bfloat16, device),
                      active_rows=torch.tensor([live], dtype=torch.int32, device=device))
    count = min(live, m)
    _assert_rows_written(out, count)
    assert torch.equal(out[:count], full[:count])


def test_linear_strided_rows(device):
    """x and out may be row slices of wider buffers (row stride != K); the bits do not change."""
    gen = seeded(4, device)
    x_wide = randn((6, 100), torch.bfloat16, device, gen)
    x = x_wide[:, 10:10 + 72]
    w = randn((36, 72), torch.bfloat16, device, gen)
    out_wide = _poison((6, 50), torch.bfloat16, device)
    gemm.linear(x, w, out=out_wide[:, 5:41])
    assert torch.equal(out_wide[:, 5:41], gemm.linear(x.contiguous(), w))
    assert torch.isnan(out_wide[:, :5]).all() and torch.isnan(out_wide[:, 41:]).all()


def test_linear_zero_k_and_empty_rows(device):
    x = torch.zeros((3, 0), dtype=torch.float32, device=device)
    w = torch.zeros((5, 0), dtype=torch.float32, device=device)
    assert torch.equal(gemm.linear(x, w, out=_poison((3, 5), torch.float32, device)), torch.zeros((3, 5), device=device))
    assert gemm.linear(torch.zeros((0, 8), device=device), torch.zeros((5, 8), device=device)).shape == (0, 5)


def test_linear_rejects_bad_arguments(device):
    x = torch.zeros((2, 8), device=device)
    with pytest.raises(ValueError, match="activation"):
        gemm.linear(x, torch.zeros((4, 8), device=device), activation="gelu")
    with pytest.raises(ValueError, match="even"):
        gemm.linear(x, torch.zeros((5, 8), device=device), activation="swiglu")
    with pytest.raises(ValueError, match="dtype"):
        gemm.linear(x, torch.zeros((4, 8), dtype=torch.bfloat16, device=device))
    with pytest.raises(ValueError, match="fp64"):
        gemm.linear(x.double(), torch.zeros((4, 8), dtype=torch.float64, device=device))
    with pytest.raises(ValueError, match="K"):
        gemm.linear(x, torch.zeros((4, 9), device=device))


# ---------------------------------------------------------------------------- launch config

MODEL_WEIGHTS = [  # (N, K, activation): Ouro-1.4B and Huginn linear layers
    (6144, 2048, None), (2048, 2048, None), (11264, 2048, "swiglu"), (2048, 5632, None), (49152, 2048, None),
    (15840, 5280, None), (5280, 5280, None), (35840, 5280, "swiglu"), (5280, 17920, None), (65536, 5280, None),
]


@pytest.mark.parametrize("n,k,activation", MODEL_WEIGHTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_linear_config_fits_and_spreads(n, k, activation, dtype):
    """Every row class's config fits the shared-memory budget, all share the weight's reduction
    plan (split and K ranges; wgmma's order over K does not depend on the K step), and decode takes
    the narrowest column tile that fits one wave."""
    decode = gemm.linear_config(n, k, dtype, activation)
    elem = dtype.itemsize
    accumulators = 2 if activation else 1
    n_out = n // accumulators
    for rows in (None, 1, gemm.SKINNY_ROWS, gemm.SKINNY_ROWS + 1, gemm.DECODE_ROWS, gemm.DECODE_ROWS + 1,
                 gemm.PREFILL_ROWS, 4096):
        cfg = gemm.linear_config(n, k, dtype, activation, rows)
        budget = gemm.SM_SHARED_BYTES if cfg.tma or cfg.swap_ab else gemm.SMEM_BUDGET_BYTES
        assert cfg.num_stages * (cfg.block_m + accumulators * cfg.block_n) * cfg.block_k * elem <= budget
        wide_skinny = cfg.swap_ab and cfg.block_m == gemm.BLOCK_M  # the 64-row transposed tile
        assert cfg.tma == (rows is not None and (rows > gemm.DECODE_ROWS or wide_skinny) and dtype != torch.float32)
        max_stages = gemm.SKINNY_MAX_STAGES if cfg.swap_ab else gemm.MAX_STAGES
        assert cfg.block_m in (gemm.SKINNY_ROWS, gemm.BLOCK_M, gemm.BLOCK_M_PREFILL) and 2 <= cfg.num_stages <= max_stages
        assert (cfg.k_bounds(k), cfg.split_k) == (decode.k_bounds(k), decode.split_k)
        if cfg.swap_ab and decode.split_k == 1:  # one K range: the skinny tile takes its wide K step
            assert cfg.block_k == max(decode.block_k, min(gemm.SKINNY_K_STEP_BYTES // elem,
                                                          triton.next_power_of_2(k)))
        if rows is None or dtype == torch.float32:
            assert cfg == decode
        elif rows <= gemm.DECODE_ROWS:  # transposed skinny tiles, or the decode tile itself
            assert cfg == decode or (cfg.swap_ab and cfg.block_m >= min(rows, gemm.SKINNY_ROWS))
        assert cfg.swap_ab == (rows is not None and dtype != torch.float32 and (
            rows <= gemm.SKINNY_ROWS or (rows <= gemm.DECODE_ROWS and decode.block_n >= gemm.SKINNY_BLOCK_N)))
    ctas = lambda width: -(-n_out // width) * decode.split_k  # noqa: E731
    widths = gemm.COLUMN_TILE_WIDTHS
    assert ctas(decode.block_n) <= gemm.WAVE_CTAS or decode.block_n == widths[-1]
    assert all(ctas(w) > gemm.WAVE_CTAS for w in widths if w < decode.block_n)  # the narrowest that fits


@pytest.mark.parametrize("rows,expected", [
    (1, {"qkv": 6, "o": 6, "gate_up": 4, "down": 6}),
    (gemm.DECODE_ROWS, {"qkv": 5, "o": 5, "gate_up": 4, "down": 5})])
def test_decode_tile_stages_at_ouro_shapes(rows, expected):
    """The pipeline depths the H200 sweeps chose for Ouro's bf16 weights (docs/perf/kernels.md):
    the 16-row transposed tiles keep about 120 KB in flight, the 64-row ones about 160 KB, SwiGLU's
    (two weight tiles a step) at least SWIGLU_SKINNY_STAGES stages. o splits
    K in 4 ranges (a wave split: 128 transposed programs instead of 32), which keeps 64-row tiles at
    64 rows."""
    shapes = {"qkv": (6144, 2048, None), "o": (2048, 2048, None), "gate_up": (11264, 2048, "swiglu"),
              "down": (2048, 5632, None)}
    configs = {name: gemm.linear_config(n, k, torch.bfloat16, act, rows) for name, (n, k, act) in shapes.items()}
    assert {name: cfg.num_stages for name, cfg in configs.items()} == expected
    assert all(cfg.swap_ab for cfg in configs.values())
    assert {name: cfg.split_k for name, cfg in configs.items()} == {"qkv": 1, "o": 4, "gate_up": 1, "down": 4}


@pytest.mark.parametrize("rows,expected", [
    (1, {"qkv": (256, 3), "o": (256, 3), "gate_up": (128, 3), "down": (128, 4), "huginn proj": (128, 4)}),
    (gemm.DECODE_ROWS, {"qkv": (256, 3), "o": (256, 3), "gate_up": (128, 3), "down": (128, 3), "huginn proj": (128, 3)})])
def test_fp8_decode_tiles_at_model_shapes(rows, expected):
    """FP8 weights' decode tiles (K step, stages) as the H200 sweep chose them (docs/perf/kernels.md),
    with the K ranges of the weight's plan unchanged: what keeps FP8 rows batch invariant."""
    shapes = {"qkv": (6144, 2048, None), "o": (2048, 2048, None), "gate_up": (11264, 2048, "swiglu"),
              "down": (2048, 5632, None), "huginn proj": (5280, 5280, None)}
    found = {}
    for name, (n, k, act) in shapes.items():
        cfg = gemm.linear_config(n, k, torch.bfloat16, act, rows, FP8_DTYPE)
        assert cfg.k_bounds(k) == gemm.linear_config(n, k, torch.bfloat16, act).k_bounds(k)
        found[name] = (cfg.block_k, cfg.num_stages)
    assert found == expected


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, FP8_DTYPE])
@pytest.mark.parametrize("rows", [gemm.DECODE_ROWS + 1, gemm.PREFILL_ROWS + 1])
@pytest.mark.parametrize("activation,n,k", [(None, 2 * 136, 80), ("swiglu", 2 * 136, 80), (None, 24, gemm.SPLIT_MIN_K)])
def test_linear_row_class_tiles(device, weight_dtype, rows, activation, n, k):
    """The middle and prefill tiles (chosen from M on the GPU) compute the same function; run
    here on a few rows with the configuration a launch of `rows` rows would take (the last weight
    is deep enough to split K). The TMA tile gives the bits of the cp.async tile the same launch
    takes where TMA cannot run (for prefill rows of a split weight, adding the K ranges itself where
    the cp.async tile writes partials for `_split_reduce_kernel`), and leaves rows past the active
    count untouched."""
    fp8 = weight_dtype == FP8_DTYPE
    cfg = gemm.linear_config(n, k, torch.bfloat16, activation, rows, weight_dtype if fp8 else None)
    plain = gemm.linear_config(n, k, torch.bfloat16, activation, rows, weight_dtype if fp8 else None, tma=False)
    assert cfg.tma == (not fp8 or (rows > gemm.PREFILL_ROWS and activation is None))
    assert not plain.tma and not plain.reduce_in_tile and cfg.k_bounds(k) == plain.k_bounds(k)
    assert cfg.reduce_in_tile == (cfg.tma and rows > gemm.PREFILL_ROWS and cfg.split_k > 1)
    gen = seeded(rows, device)
    x = randn((5, k), torch.bfloat16, device, gen)
    w, scale = linear_weight(n, k, weight_dtype, device, gen)
    n_out = n // 2 if activation else n

    def run(config, live=None, dtype=torch.bfloat16):
        active = None if live is None else torch.tensor([live], dtype=torch.int32, device=device)
        return gemm._launch(x, w, _poison((5, n_out), dtype, device), active, activation, config, scale)

    got = run(cfg)
    wide = w.float() if scale is None else w.float() * scale[:, None]
    _assert_close_to(got, _exact(x, wide, activation), x, wide, activation)
    if fp8:  # the other tile of the class runs too: TMA where the rule takes cp.async, and the reverse
        assert torch.equal(got, run(dataclasses.replace(plain, tma=True)))
    assert torch.equal(got, run(plain))
    partial = run(cfg, live=2)
    _assert_rows_written(partial, 2)
    assert torch.equal(partial[:2], got[:2])


@pytest.mark.parametrize("activation,n,k", [(None, 4352, 80), ("swiglu", 2 * 4352, 80), (None, 1088, gemm.SPLIT_MIN_K)])
def test_wide_decode_tile_by_tma(device, activation, n, k):
    """The 64-row transposed decode tile (launches of 17-64 rows) is fetched by TMA where TMA can
    run (`_linear_tma_kernel` with SWAP_AB) and gives the bits of the same tile by cp.async, the
    16-row tile keeps cp.async, and rows past the active count are not written (an unsplit and a
    SwiGLU weight with 64-column decode tiles, and a deep split one)."""
    cfg = gemm.linear_config(n, k, torch.bfloat16, activation, gemm.DECODE_ROWS)
    plain = gemm.linear_config(n, k, torch.bfloat16, activation, gemm.DECODE_ROWS, tma=False)
    assert cfg.swap_ab and cfg.tma and cfg.block_m == gemm.BLOCK_M and dataclasses.replace(cfg, tma=False) == plain
    assert not gemm.linear_config(n, k, torch.bfloat16, activation, gemm.SKINNY_ROWS).tma
    assert not gemm.linear_config(n, k, torch.bfloat16, activation, gemm.DECODE_ROWS, FP8_DTYPE).tma
    gen = seeded(n + k, device)
    x = randn((5, k), torch.bfloat16, device, gen)
    w, _ = linear_weight(n, k, torch.bfloat16, device, gen)
    n_out = n // 2 if activation else n

    def run(config, live=None):
        active = None if live is None else torch.tensor([live], dtype=torch.int32, device=device)
        return gemm._launch(x, w, _poison((5, n_out), torch.bfloat16, device), active, activation, config)

    got = run(cfg)
    _assert_close_to(got, _exact(x, w.float(), activation), x, w.float(), activation)
    assert torch.equal(got, run(plain))
    partial = run(cfg, live=3)
    _assert_rows_written(partial, 3)
    assert torch.equal(partial[:3], got[:3])


@pytest.mark.parametrize("rows", [1, gemm.DECODE_ROWS + 1, gemm.PREFILL_ROWS + 1])
@pytest.mark.parametrize("tma", [True, False])
@pytest.mark.parametrize("k", [gemm.SPLIT_MIN_K, 2048])  # a deep split, and a wave split (few columns)
def test_split_ranges_add_in_range_order(device, rows, tma, k):
    """A split weight's K ranges are summed each on its own, then added first to last, whatever
    the tile (partials and `_split_reduce_kernel`, or a TMA tile adding them itself). Range sums
    of 2^24, 1, 1, 0 (each exact, so no dot order matters) give 2^24 in that order (2^24 + 1 rounds
    to even) and 2^24 + 2 in any order that adds the ones first; range sums of 2^24, 2 (two ones in
    different K steps of range 1) give 2^24 + 2, which one running sum over all of K rounds to
    2^24. An fp32 output keeps the differences."""
    n = 24
    cfg = gemm.linear_config(n, k, torch.bfloat16, None, rows, tma=tma)
    starts = cfg.k_bounds(k)[:-1]
    wave = k < gemm.SPLIT_MIN_K
    assert len(starts) == 4 and cfg.reduce_in_tile == (tma and (rows > gemm.PREFILL_ROWS or (wave and rows > 1)))
    x = torch.ones((3, k), dtype=torch.bfloat16, device=device)
    for entries, want in ((zip(starts, (2.0**24, 1.0, 1.0, 0.0)), 2.0**24),
                          (((starts[0], 2.0**24), (starts[1], 1.0), (starts[1] + cfg.block_k, 1.0)), 2.0**24 + 2)):
        w = torch.zeros((n, k), dtype=torch.bfloat16, device=device)
        for at, value in entries:
            w[:, at] = value
        out = gemm._launch(x, w, _poison((3, n), torch.float32, device), None, None, cfg)
        assert torch.equal(out, torch.full_like(out, want))


@pytest.mark.parametrize("rows,expected", [
    (128, {"qkv": (64, 128, 128, 4), "o": (64, 64, 128, 5), "gate_up": (64, 64, 64, 3), "down": (64, 128, 128, 4)}),
    (256, {"qkv": (64, 256, 64, 5), "o": (64, 64, 128, 5), "gate_up": (64, 64, 64, 3), "down": (64, 256, 64, 5)}),
    (2048, {"qkv": (128, 128, 64, 3), "o": (64, 256, 64, 5), "gate_up": (128, 128, 64, 4), "down": (64, 256, 64, 5)})])
def test_tma_tiles_at_ouro_shapes(rows, expected):
    """The TMA tiles the H200 sweep chose for Ouro's bf16 weights (docs/perf/kernels.md): wide tiles
    while they fill the GPU's waves, narrower ones where the weight has few columns; FP8 weights take
    them only for prefill rows without SwiGLU, fp32 never."""
    shapes = {"qkv": (6144, 2048, None), "o": (2048, 2048, None), "gate_up": (11264, 2048, "swiglu"),
              "down": (2048, 5632, None)}
    found = {}
    for name, (n, k, act) in shapes.items():
        cfg = gemm.linear_config(n, k, torch.bfloat16, act, rows)
        assert cfg.tma and cfg.split_k == gemm.linear_config(n, k, torch.bfloat16, act).split_k
        assert cfg.split_k == (4 if name in ("o", "down") else 1)  # o: a wave split, down: a deep one
        # Prefill rows add the ranges in the tile; middle rows too for o, whose split serves decode only.
        assert cfg.reduce_in_tile == (cfg.split_k > 1 and (rows > gemm.PREFILL_ROWS or name == "o"))
        found[name] = (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages)
        fp8 = gemm.linear_config(n, k, torch.bfloat16, act, rows, FP8_DTYPE)
        assert fp8.tma == (rows > gemm.PREFILL_ROWS and act is None) and fp8.k_bounds(k) == cfg.k_bounds(k)
        if cfg.reduce_in_tile and rows > gemm.PREFILL_ROWS:  # the sum of finished ranges is a second fp32 tile
            assert (cfg.block_m, cfg.block_n, cfg.num_warps) == (64, 256, 8)
            assert (fp8.block_m, fp8.block_n, fp8.num_warps, fp8.num_stages) == (128, 64, 4, 3) and fp8.reduce_in_tile
        assert not gemm.linear_config(n, k, torch.float32, act, rows).tma
    assert found == expected


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, FP8_DTYPE])
@pytest.mark.parametrize("activation,n,k", [(None, 96, 80), ("swiglu", 2 * 80, 136), (None, 24, gemm.SPLIT_MIN_K)])
def test_linear_transposed_skinny_tiles_keep_the_bits(device, weight_dtype, activation, n, k):
    """The skinny decode tile computes out^T = W x^T: the same bits as the untransposed decode tile
    (one and several row tiles, ragged K, a split weight, FP8 scales, rows past the active count
    untouched) and close to the exact product. Under the interpreter the dots are exact; on the
    H200 the same holds for wgmma (test_gpu_model_shapes_bf16, test_gpu_fp8_row_classes_keep_the_bits)."""
    skinny = gemm.linear_config(n, k, torch.bfloat16, activation, 1)
    decode = gemm.linear_config(n, k, torch.bfloat16, activation)
    assert skinny.swap_ab and not decode.swap_ab and skinny.k_bounds(k) == decode.k_bounds(k)
    gen = seeded(n + k, device)
    w, scale = linear_weight(n, k, weight_dtype, device, gen)
    x = randn((21, k), torch.bfloat16, device, gen)
    n_out = n // 2 if activation else n

    def run(cfg, rows, live=None):
        out = _poison((rows.shape[0], n_out), torch.bfloat16, device)
        active = None if live is None else torch.tensor([live], dtype=torch.int32, device=device)
        return gemm._launch(rows, w, out, active, activation, cfg, scale)

    full = run(decode, x)
    for rows in (x[:1], x[:5], x):  # one row tile of 16, then two
        assert torch.equal(run(skinny, rows), full[:rows.shape[0]])
    partial = run(skinny, x, live=3)
    _assert_rows_written(partial, 3)
    assert torch.equal(partial[:3], full[:3])
    wide = w.float() if scale is None else w.float() * scale[:, None]
    _assert_close_to(full, _exact(x, wide, activation), x, wide, activation)


@pytest.mark.parametrize("split_k", [2, 3, 8])
@pytest.mark.parametrize("activation", [None, "swiglu"])
@pytest.mark.parametrize("k", [40, 96, 136])
def test_linear_split_k(device, split_k, activation, k):
    """K cut into fixed ranges (the last one shorter when K is ragged, fewer ranges than asked
    when K has fewer steps): same result as the unsplit kernel up to fp32 reassociation, rows
    past the active count untouched, and a row's bits independent of M."""
    m, n = 37, 48
    cfg = gemm.LinearConfig(64, 32, 16, 4, 2, split_k=split_k)
    gen = seeded(split_k * k, device)
    x = randn((m, k), torch.float32, device, gen)
    w = randn((n, k), torch.float32, device, gen, scale=k**-0.5)
    n_out = n // 2 if activation else n

    def run(rows, live=None):
        out = _poison((rows.shape[0], n_out), torch.float32, device)
        active = None if live is None else torch.tensor([live], dtype=torch.int32, device=device)
        return gemm._launch(rows, w, out, active, activation, cfg)

    full = run(x)
    _assert_close_to(full, _exact(x, w, activation), x, w, activation)
    partial = run(x, live=20)
    _assert_rows_written(partial, 20)
    assert torch.equal(partial[:20], full[:20])
    for rows in (1, 5, 29):
        assert torch.equal(run(x[:rows]), full[:rows])
    perm = torch.randperm(m, generator=torch.Generator().manual_seed(k)).to(device)
    assert torch.equal(run(x[perm]), full[perm])


# ------------------------------------------------------------------ batch invariance (bitwise)


@settings(max_examples=25)
@given(m=st.integers(2, 80), seed=st.integers(0, 2**16), pad=st.integers(1, 40),
       activation=st.sampled_from([None, "swiglu"]), dtype=st.sampled_from([torch.bfloat16, torch.float32]),
       k=st.sampled_from([40, 136]))
def test_linear_is_batch_invariant(device, m, seed, pad, activation, dtype, k):
    """A row's output bits are the same alone, in the batch, permuted and next to padding rows
    (garbage rows past the active count)."""
    gen = seeded(seed, device)
    x = randn((m, k), dtype, device, gen)
    w = randn((72, k), dtype, device, gen, scale=k**-0.5)
    full = gemm.linear(x, w, activation=activation)
    perm = torch.randperm(m, generator=torch.Generator().manual_seed(seed)).to(device)
    assert torch.equal(gemm.linear(x[perm], w, activation=activation), full[perm])
    row = int(perm[0])
    assert torch.equal(gemm.linear(x[row:row + 1], w, activation=activation)[0], full[row])
    padded = torch.cat([x, randn((pad, k), dtype, device, gen, scale=1e3)])
    out = gemm.linear(padded, w, activation=activation, active_rows=torch.tensor([m], dtype=torch.int32, device=device))
    assert torch.equal(out[:m], full)


# ---------------------------------------------------------------------------------- GPU (H200)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,activation", MODEL_WEIGHTS)
def test_gpu_model_shapes_bf16(device, n, k, activation):
    gen = seeded(n + k, device)
    w = randn((n, k), torch.bfloat16, device, gen, scale=k**-0.5)
    x = randn((1100, k), torch.bfloat16, device, gen)  # the prefill row class
    full = gemm.linear(x, w, activation=activation)
    ref = gemm.linear_reference(x, w, activation=activation)
    torch.testing.assert_close(full.float(), ref.float(), rtol=2 * EPS[torch.bfloat16], atol=2e-2)
    _assert_rounds_like(full, ref, device)
    for m in (1, 5, 16, 64, 65, 300):  # decode and middle row classes
        assert torch.equal(gemm.linear(x[:m], w, activation=activation), full[:m]), f"row bits changed at M={m}"
    perm = torch.randperm(1100, device=device, generator=gen)
    assert torch.equal(gemm.linear(x[perm], w, activation=activation), full[perm])


@pytest.mark.gpu
@pytest.mark.parametrize("bucket", [128, 256])
@pytest.mark.parametrize("n,k,activation,weight_dtype", [  # Ouro qkv, o (wave split), gate_up, down (split), FP8 gate_up
    (6144, 2048, None, torch.bfloat16), (2048, 2048, None, torch.bfloat16), (11264, 2048, "swiglu", torch.bfloat16),
    (2048, 5632, None, torch.bfloat16), (11264, 2048, "swiglu", FP8_DTYPE)])
def test_gpu_graph_replay_follows_active_rows(device, bucket, n, k, activation, weight_dtype):
    """Captured once at a bucket of the middle row class; each replay writes only the rows below
    the count, with the bits of the full launch (TMA tiles, and FP8's cp.async tiles)."""
    gen = seeded(n + k, device)
    w, scale = linear_weight(n, k, weight_dtype, device, gen)
    x = randn((bucket, k), torch.bfloat16, device, gen)
    expected = gemm.linear(x, w, activation=activation, weight_scale=scale)
    active = torch.tensor([bucket], dtype=torch.int32, device=device)
    out = torch.empty_like(expected)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile outside the capture
        gemm.linear(x, w, activation=activation, out=out, active_rows=active, weight_scale=scale)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm.linear(x, w, activation=activation, out=out, active_rows=active, weight_scale=scale)
    for live in (3, 64, 65, 100, 128, 129, 192, bucket, 0):
        live = min(live, bucket)
        out.fill_(float("nan"))
        active.fill_(live)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[:live], expected[:live])
        assert torch.isnan(out[live:]).all()
