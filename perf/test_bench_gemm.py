"""Batch-invariant `linear` on the H200 at Ouro-1.4B and Huginn weight shapes.

For every (weight, M) pair the JSON entry holds: the kernel time, GB/s on the bytes it must
move (weights + x + out) and that as a fraction of the measured copy bandwidth (the decode
figure, M <= 16), TFLOP/s and its fraction of the measured bf16 GEMM rate, `vs_matmul` = the
kernel's speed relative to torch.matmul (cuBLAS) on the same GEMM in the same run (the large-M
figure; for swiglu the kernel also does the activation), `speedup_vs_baseline` against the
plain-torch layer (matmul, plus silu * up for swiglu), and the launch config.

Weights are rotated through enough copies to exceed the L2 cache, so small weights are read
from HBM as in a real forward pass.

`test_bench_linear_fp8` times the FP8 weights (`quantization="fp8"`) at the same shapes: W8A16
(bf16 rows) and W8A8 (FP8 rows from `quantize_rows`), each against cuBLASLt's FP8 GEMM with row and
channel scales (`torch._scaled_mm`, the library kernel for the job; it takes FP8 rows only, so the
W8A16 entries name it as the nearest), the plain-torch layer (W8A16: the weight cast to bf16 and
scaled on every call, then matmul; W8A8: `_scaled_mm` plus the activation) and the bf16 layer of
the same shape (`vs_bf16`). Its bandwidth fraction counts FP8 weight bytes.

    pytest perf/test_bench_gemm.py --benchmark-json=out/gemm.json
    RLT_GEMM_SWEEP=1 pytest perf/test_bench_gemm.py -k sweep   # candidate configs, for tuning
    RLT_GEMM_SWEEP=1 pytest perf/test_bench_gemm.py -k skinny_sweep   # the transposed decode tiles
    RLT_GEMM_SWEEP=1 pytest perf/test_bench_gemm.py -k mid_sweep      # the TMA tiles of launches > 64 rows
    RLT_GEMM_SWEEP=1 pytest perf/test_bench_gemm.py -k w8a8_mid_sweep # the same for W8A8 (FP8 rows and weights)

The sweeps check every candidate's bits at M = 256 against the tile in use and, row 0, against
`linear` of that row alone (batch invariance).
"""

import concurrent.futures
import dataclasses
import functools
import itertools
import multiprocessing
import os

import pytest
import torch
from triton.runtime.errors import OutOfResources

from perf.conftest import cuda_time_ms, record, requires_cuda
from rlt_kernels import gemm
from rlt_kernels.fp8 import FP8_DTYPE, dequantize_weight_fp8, quantize_weight_fp8
from rlt_kernels.fp8_rows import quantize_rows

pytestmark = requires_cuda

WEIGHTS = [  # (name, N, K, activation)
    ("ouro.qkv", 6144, 2048, None),
    ("ouro.o", 2048, 2048, None),
    ("ouro.gate_up", 11264, 2048, "swiglu"),
    ("ouro.down", 2048, 5632, None),
    ("ouro.lm_head", 49152, 2048, None),
    ("huginn.Wqkv", 15840, 5280, None),
    ("huginn.proj", 5280, 5280, None),
    ("huginn.fc", 35840, 5280, "swiglu"),
    ("huginn.mlp_proj", 5280, 17920, None),
]
ROWS = [1, 4, 16, 64, 256, 2048]
ROTATION_BYTES = 512 * 1024 * 1024  # > 10x the H200's 50 MB L2
DTYPE = torch.bfloat16


@functools.lru_cache(maxsize=1)
def _weights(n: int, k: int) -> tuple:
    """Copies of one random weight, enough that cycling through them misses L2."""
    w = torch.randn(n, k, dtype=DTYPE, device="cuda") * k**-0.5
    copies = max(1, min(32, ROTATION_BYTES // w.nbytes))
    return (w,) + tuple(w.clone() for _ in range(copies - 1))


def _cycling(calls):
    """One callable that runs the next of `calls` each time (round robin)."""
    it = itertools.cycle(calls)
    return lambda: next(it)()


def _swiglu(y, activation):
    if activation != "swiglu":
        return y
    f = y.shape[1] // 2
    return torch.nn.functional.silu(y[:, :f]) * y[:, f:]


def _torch_layer(x, w, activation, mm_out):
    return _swiglu(torch.matmul(x, w.T, out=mm_out), activation)


def _sync(fn):
    def run():
        fn()
        torch.cuda.synchronize()

    return run


@pytest.mark.parametrize("name,n,k,activation,m", [(*w, m) for w in WEIGHTS for m in ROWS],
                         ids=[f"{w[0]}-M{m}" for w in WEIGHTS for m in ROWS])
def test_bench_linear(benchmark, roofline, name, n, k, activation, m):
    weights = _weights(n, k)
    n_out = n // 2 if activation == "swiglu" else n
    x = torch.randn(m, k, dtype=DTYPE, device="cuda")
    out = torch.empty(m, n_out, dtype=DTYPE, device="cuda")
    mm_out = torch.empty(m, n, dtype=DTYPE, device="cuda")

    kernel = _cycling([functools.partial(gemm.linear, x, w, out=out, activation=activation) for w in weights])
    matmul = _cycling([functools.partial(torch.matmul, x, w.T, out=mm_out) for w in weights])
    layer = _cycling([functools.partial(_torch_layer, x, w, activation, mm_out) for w in weights])
    ms = cuda_time_ms(kernel)
    matmul_ms = cuda_time_ms(matmul)
    layer_ms = cuda_time_ms(layer)

    weight_bytes = n * k * DTYPE.itemsize
    weight_gbps = weight_bytes / (ms * 1e-3) / 1e9
    record(
        benchmark, roofline, name=f"linear {name} M={m}", ms=ms,
        bytes_moved=weight_bytes + (m * k + m * n_out) * DTYPE.itemsize, flops=2 * m * n * k,
        baseline_ms=layer_ms, matmul_ms=matmul_ms, vs_matmul=matmul_ms / ms,
        weight_gbps=weight_gbps, frac_bandwidth_weights=weight_gbps / roofline["copy_gbps"],
        m=m, n=n, k=k, activation=activation, regime="decode (bandwidth)" if m <= 16 else "compute",
        config=dataclasses.asdict(gemm.linear_config(n, k, DTYPE, activation, m)),
    )
    benchmark.pedantic(_sync(kernel), rounds=10, warmup_rounds=1)


@functools.lru_cache(maxsize=1)
def _fp8_weights(n: int, k: int) -> tuple:
    """(FP8 weight [N, K], fp32 channel scales [N]) of every rotated copy of `_weights(n, k)`."""
    return tuple(quantize_weight_fp8(w) for w in _weights(n, k))


def _cublaslt_fp8_layer(xq, x_scale, w, w_scale, activation):
    """cuBLASLt's FP8 GEMM with row and channel scales (FP8 rows, FP8 weight), then the activation."""
    y = torch._scaled_mm(xq, w.T, scale_a=x_scale[:, None], scale_b=w_scale[None, :], out_dtype=DTYPE)
    return _swiglu(y, activation)


def _torch_w8a16_layer(x, w, w_scale, activation):
    """The plain-torch W8A16 layer: the weight widened and scaled on every call, then matmul."""
    return _swiglu(torch.matmul(x, dequantize_weight_fp8(w, w_scale, DTYPE).T), activation)


FP8_WEIGHTS = [w for w in WEIGHTS if w[0] != "ouro.lm_head"]  # the LM head stays bf16 under quantization="fp8"


@pytest.mark.parametrize("name,n,k,activation,m,mode",
                         [(*w, m, mode) for w in FP8_WEIGHTS for m in ROWS for mode in ("w8a16", "w8a8")],
                         ids=[f"{w[0]}-M{m}-{mode}" for w in FP8_WEIGHTS for m in ROWS for mode in ("w8a16", "w8a8")])
def test_bench_linear_fp8(benchmark, roofline, name, n, k, activation, m, mode):
    pairs = _fp8_weights(n, k)
    n_out = n // 2 if activation == "swiglu" else n
    x = torch.randn(m, k, dtype=DTYPE, device="cuda")
    xq, x_scale = quantize_rows(x)
    rows, rows_scale = (xq, x_scale) if mode == "w8a8" else (x, None)
    out = torch.empty(m, n_out, dtype=DTYPE, device="cuda")
    kernel = _cycling([functools.partial(gemm.linear, rows, w, out=out, activation=activation, weight_scale=s,
                                         x_scale=rows_scale) for w, s in pairs])
    # cuBLASLt wants at least 16 FP8 rows on some versions: pad the rows if it refuses fewer.
    lib_rows = m
    try:
        _cublaslt_fp8_layer(xq, x_scale, *pairs[0], activation)
    except RuntimeError:
        lib_rows = 16 * -(-m // 16)
    lib_x, lib_scale = quantize_rows(torch.nn.functional.pad(x, (0, 0, 0, lib_rows - m)))
    library = _cycling([functools.partial(_cublaslt_fp8_layer, lib_x, lib_scale, w, s, activation) for w, s in pairs])
    if mode == "w8a8":
        layer = library
    else:
        layer = _cycling([functools.partial(_torch_w8a16_layer, x, w, s, activation) for w, s in pairs])
    mm_out = torch.empty(m, n, dtype=DTYPE, device="cuda")
    bf16_layer = _cycling([functools.partial(_torch_layer, x, w, activation, mm_out) for w in _weights(n, k)])
    ms, library_ms, layer_ms, bf16_ms = (cuda_time_ms(f) for f in (kernel, library, layer, bf16_layer))

    got = gemm.linear(rows, pairs[0][0], activation=activation, weight_scale=pairs[0][1], x_scale=rows_scale)
    lib_got = _cublaslt_fp8_layer(lib_x, lib_scale, *pairs[0], activation)[:m]
    x_bytes = m * k * (1 if mode == "w8a8" else DTYPE.itemsize)
    weight_gbps = n * k / (ms * 1e-3) / 1e9
    record(
        benchmark, roofline, name=f"linear fp8 {mode} {name} M={m}", ms=ms,
        bytes_moved=n * k + x_bytes + m * n_out * DTYPE.itemsize, flops=2 * m * n * k,
        baseline_ms=layer_ms, library_ms=library_ms, vs_library=library_ms / ms, library_rows=lib_rows,
        library="cuBLASLt FP8 (torch._scaled_mm, row x channel scales)" + (" on FP8 rows" if mode == "w8a16" else ""),
        bf16_layer_ms=bf16_ms, vs_bf16=bf16_ms / ms,
        weight_gbps=weight_gbps, frac_bandwidth_weights=weight_gbps / roofline["copy_gbps"],
        max_abs_diff_vs_library=(got.float() - lib_got.float()).abs().max().item(),
        m=m, n=n, k=k, activation=activation, mode=mode,
        regime="decode (bandwidth)" if m <= 16 else "compute",
    )
    benchmark.pedantic(_sync(kernel), rounds=10, warmup_rounds=1)


def _candidates(n: int, k: int, activation) -> list:
    """Tile configs to compare with the table's choice (all fit the shared-memory budget)."""
    accumulators = 2 if activation == "swiglu" else 1
    found = []
    for block_n, block_k, stages in itertools.product((16, 32, 64, 128), (64, 128, 256), (3, 4, 5)):
        if stages * (gemm.BLOCK_M + accumulators * block_n) * block_k * DTYPE.itemsize > gemm.SMEM_BUDGET_BYTES:
            continue
        warps = 4 if accumulators * block_n <= 128 else 8
        found.append(gemm.LinearConfig(gemm.BLOCK_M, block_n, block_k, warps, stages))
        if block_n in (16, 32, 64) and block_k == 128:  # split-K: more CTAs for skinny weights
            found += [gemm.LinearConfig(gemm.BLOCK_M, block_n, block_k, warps, stages, split_k=s) for s in (2, 4)]
    # 128-row tiles (two wgmma row groups) for prefill-sized M.
    found += [gemm.LinearConfig(128, block_n, 64, 8, stages) for block_n in (64, 128) for stages in (3, 4)
              if stages * (128 + accumulators * block_n) * 64 * DTYPE.itemsize <= gemm.SMEM_BUDGET_BYTES]
    return found


def _operands(n: int, k: int, w8a8: bool) -> tuple:
    """(weight, weight_scale) of every rotated copy: bf16 with no scale, or (W8A8) FP8 with channel scales."""
    return _fp8_weights(n, k) if w8a8 else tuple((w, None) for w in _weights(n, k))


def _rows(m: int, k: int, w8a8: bool, fill=torch.randn) -> tuple:
    """Activation rows [m, k] and their scales: bf16 (no scale), or (W8A8) FP8 rows from `quantize_rows`."""
    x = fill(m, k, dtype=DTYPE, device="cuda")
    return quantize_rows(x) if w8a8 else (x, None)


def _run(x, x_scale, w, w_scale, activation, cfg, out=None):
    """One launch of ``cfg`` (bf16 out)."""
    n_out = w.shape[0] // 2 if activation == "swiglu" else w.shape[0]
    out = torch.empty(x.shape[0], n_out, dtype=DTYPE, device="cuda") if out is None else out
    return gemm._launch(x, w, out, None, activation, cfg, weight_scale=w_scale, x_scale=x_scale)


def _compile_one(n: int, k: int, activation, w8a8: bool, cfg) -> bool:
    """Compile one candidate for the sweep's launch specialisations (M = 1 and M % 16 == 0);
    False when it needs more shared memory than the GPU has."""
    w = torch.zeros(n, k, dtype=FP8_DTYPE if w8a8 else DTYPE, device="cuda")
    w_scale = torch.ones(n, dtype=torch.float32, device="cuda") if w8a8 else None
    try:
        for m in (1, 16):
            _run(*_rows(m, k, w8a8, torch.zeros), w, w_scale, activation, cfg)
    except OutOfResources:
        return False
    torch.cuda.synchronize()
    return True


def _warm_compile_cache(n: int, k: int, activation, candidates, w8a8: bool = False) -> list:
    """Compile every candidate in parallel worker processes first (Triton's on-disk cache is
    shared), so the timed loop below is not serialised behind one compiler per candidate;
    returns the candidates that fit the GPU."""
    workers = min(len(candidates), max(1, (os.cpu_count() or 2) - 2), 12)
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        fits = list(pool.map(functools.partial(_compile_one, n, k, activation, w8a8), candidates))
    return [cfg for cfg, ok in zip(candidates, fits) if ok]


SWEEP_ROWS = (1, 16, 256, 2048)
MID_SWEEP_ROWS = (128, 256, 512, 2048)


def _mid_candidates(n: int, k: int, activation) -> list:
    """TMA tiles for launches of more than 64 rows (the middle and prefill classes, `_tma_tile`):
    64/128 rows, 64-256 columns, 64/128-element K steps, 4/8 warps, 3-5 stages, with the weight's
    K ranges; each candidate runs at every M of MID_SWEEP_ROWS."""
    accumulators = 2 if activation == "swiglu" else 1
    plan = gemm.linear_config(n, k, DTYPE, activation)
    found = []
    for block_m, block_n, block_k, warps, stages in itertools.product(
            (64, 128), (64, 128, 256), (64, 128), (4, 8), (3, 4, 5)):
        if stages * (block_m + accumulators * block_n) * block_k * DTYPE.itemsize > 220 * 1024:
            continue
        if block_m * accumulators * block_n // (warps * 32) > 128 or (block_m == 128 and warps == 4):
            continue  # fp32 accumulators per thread; 128 rows take two warp groups
        cfg = gemm.LinearConfig(block_m, block_n, block_k, warps, stages, split_k=plan.split_k, tma=True)
        if cfg.k_bounds(k) == plan.k_bounds(k):
            found.append(cfg)
    return found


W8A8_MID_SWEEP_ROWS = (128, 256, 512)


def _w8a8_mid_candidates(n: int, k: int, activation) -> list:
    """TMA tiles for W8A8 launches of more than 64 rows (FP8 rows and weights, one byte an element):
    64/128 rows, 64-256 columns, 128-512-element K steps, 4/8 warps, 3-6 stages, with the weight's
    K ranges (a split weight adds them in the tile, as `_tma_tile` makes it at these rows)."""
    accumulators = 2 if activation == "swiglu" else 1
    plan = gemm.linear_config(n, k, FP8_DTYPE, activation)
    in_tile = plan.split_k > 1
    found = []
    for block_m, block_n, block_k, warps, stages in itertools.product(
            (64, 128), (64, 128, 256), (128, 256, 512), (4, 8), (3, 4, 5, 6)):
        if stages * (block_m + accumulators * block_n) * block_k > 220 * 1024:
            continue
        if block_m * accumulators * block_n * (2 if in_tile else 1) // (warps * 32) > 128:
            continue  # fp32 accumulators (and the ranges' sums) per thread
        if warps == 8 and block_m * accumulators * block_n < 64 * 128:
            continue
        cfg = gemm.LinearConfig(block_m, block_n, block_k, warps, stages, split_k=plan.split_k, tma=True,
                                reduce_in_tile=in_tile)
        if cfg.k_bounds(k) == plan.k_bounds(k):
            found.append(cfg)
    return found


def _skinny_candidates(n: int, k: int, activation, block_m: int) -> list:
    """Transposed decode tiles (out^T = W x^T, `block_m` batch rows) with the weight's reduction
    plan: column widths, K steps, 2..6 stages (the bytes a program keeps in flight), 4 or 8 warps."""
    accumulators = 2 if activation == "swiglu" else 1
    split = gemm.linear_config(n, k, DTYPE, activation).split_k
    found = []
    for block_n, block_k, stages, warps in itertools.product((16, 32, 64, 128), (128, 256), (2, 3, 4, 5, 6), (4, 8)):
        if warps == 8 and accumulators * block_n < 128:
            continue
        if stages * (block_m + accumulators * block_n) * block_k * DTYPE.itemsize > 200 * 1024:
            continue
        found.append(gemm.LinearConfig(block_m, block_n, block_k, warps, stages, split_k=split, swap_ab=True))
    return found


@pytest.mark.skipif(os.environ.get("RLT_GEMM_SWEEP") != "1", reason="tuning sweep: set RLT_GEMM_SWEEP=1")
@pytest.mark.parametrize("block_m,rows", [(gemm.SKINNY_ROWS, (1, 16)), (gemm.BLOCK_M, (64,))], ids=["rows16", "rows64"])
@pytest.mark.parametrize("name,n,k,activation", WEIGHTS[:4] + WEIGHTS[6:7], ids=[w[0] for w in WEIGHTS[:4] + WEIGHTS[6:7]])
def test_bench_linear_skinny_sweep(benchmark, roofline, name, n, k, activation, block_m, rows):
    """The transposed decode tiles (`_skinny_config`), with bits checked against the tile in use."""
    in_use = gemm.linear_config(n, k, DTYPE, activation, rows[0])
    candidates = _skinny_candidates(n, k, activation, block_m)
    _sweep(benchmark, roofline, name, n, k, activation, candidates + [in_use] * (in_use not in candidates), rows,
           f"skinny{block_m}", in_use=in_use)


@pytest.mark.skipif(os.environ.get("RLT_GEMM_SWEEP") != "1", reason="tuning sweep: set RLT_GEMM_SWEEP=1")
@pytest.mark.parametrize("name,n,k,activation", WEIGHTS, ids=[w[0] for w in WEIGHTS])
def test_bench_linear_config_sweep(benchmark, roofline, name, n, k, activation):
    _sweep(benchmark, roofline, name, n, k, activation, _candidates(n, k, activation), SWEEP_ROWS, "decode")


@pytest.mark.skipif(os.environ.get("RLT_GEMM_SWEEP") != "1", reason="tuning sweep: set RLT_GEMM_SWEEP=1")
@pytest.mark.parametrize("name,n,k,activation", WEIGHTS[:4], ids=[w[0] for w in WEIGHTS[:4]])
def test_bench_linear_mid_sweep(benchmark, roofline, name, n, k, activation):
    """Launches of more than 64 rows (middle and prefill classes) over the TMA tiles; `chosen`
    marks the tile the rule takes at M = 256."""
    in_use = gemm.linear_config(n, k, DTYPE, activation, 256)
    _sweep(benchmark, roofline, name, n, k, activation, _mid_candidates(n, k, activation), MID_SWEEP_ROWS, "mid",
           in_use=in_use)


@pytest.mark.skipif(os.environ.get("RLT_GEMM_SWEEP") != "1", reason="tuning sweep: set RLT_GEMM_SWEEP=1")
@pytest.mark.parametrize("name,n,k,activation", WEIGHTS[:4], ids=[w[0] for w in WEIGHTS[:4]])
def test_bench_linear_w8a8_mid_sweep(benchmark, roofline, name, n, k, activation):
    """W8A8 launches of more than 64 rows over the TMA tiles (the batch-256 decode step's linear
    layers); `chosen` marks the tile the rule takes at M = 256, and each M's tile in use is timed too."""
    in_use = [gemm.linear_config(n, k, FP8_DTYPE, activation, m) for m in W8A8_MID_SWEEP_ROWS]
    candidates = _w8a8_mid_candidates(n, k, activation)
    candidates += [c for c in dict.fromkeys(in_use) if c not in candidates]
    _sweep(benchmark, roofline, name, n, k, activation, candidates, W8A8_MID_SWEEP_ROWS, "w8a8 mid",
           in_use=in_use[1], w8a8=True)


def _sweep(benchmark, roofline, name, n, k, activation, candidates, sweep_rows, kind, in_use=None, w8a8=False):
    """Times every candidate config at decode and prefill sizes; the JSON lists them so the
    `linear_config` table can be re-tuned from one GPU run (a config is used for all M; `chosen`
    marks the table's config, or `in_use` when given). ``w8a8``: FP8 rows and weights.
    `same_bits_as_chosen`: whether the candidate's M=256 output equals the chosen config's bit
    for bit (tells which tile shapes share one reduction order on this GPU); `same_bits_as_one_row`:
    whether its row 0 equals `linear` of that row alone (batch invariance)."""
    operands = _operands(n, k, w8a8)
    dtype = FP8_DTYPE if w8a8 else DTYPE
    table = gemm.linear_config(n, k, dtype, activation)
    in_use = in_use or table
    probe, probe_scale = _rows(256, k, w8a8)
    chosen_bits = _run(probe, probe_scale, *operands[0], activation, in_use).view(torch.int16)
    one_row = gemm.linear(probe[:1], operands[0][0], activation=activation, weight_scale=operands[0][1],
                          x_scale=None if probe_scale is None else probe_scale[:1]).view(torch.int16)
    candidates = _warm_compile_cache(n, k, activation, candidates, w8a8)
    results = []
    for cfg in candidates:
        row = {"config": dataclasses.asdict(cfg), "chosen": cfg == in_use}
        for m in sweep_rows:
            x, x_scale = _rows(m, k, w8a8)
            out = torch.empty(m, n // 2 if activation == "swiglu" else n, dtype=DTYPE, device="cuda")
            run = _cycling([functools.partial(_run, x, x_scale, w, s, activation, cfg, out) for w, s in operands])
            row[f"ms_M{m}"] = cuda_time_ms(run, iters=20)
        bits = _run(probe, probe_scale, *operands[0], activation, cfg).view(torch.int16)
        row["same_bits_as_chosen"] = bool(torch.equal(bits, chosen_bits))
        row["same_bits_as_one_row"] = bool(torch.equal(bits[:1], one_row))
        results.append(row)
    first, last = f"ms_M{sweep_rows[0]}", f"ms_M{sweep_rows[-1]}"
    best_small = min(results, key=lambda r: r[first])
    best_large = min(results, key=lambda r: r[last])
    chosen = next(r for r in results if r["chosen"]) if any(r["chosen"] for r in results) else None
    print(f"\n{name} ({kind}): chosen {chosen and {k: chosen[k] for k in chosen if k.startswith('ms')}}")
    for key in dict.fromkeys((first, "ms_M256", last)):
        print(f" best at {key}:")
        for r in sorted(results, key=lambda r: r[key])[:4]:
            print(f"  {r['config']} " + " ".join(f"{k}={r[k]:.4f}" for k in r if k.startswith("ms"))
                  + f" bits={r['same_bits_as_chosen']} one_row={r['same_bits_as_one_row']}")
    matmul = _cycling([functools.partial(torch.matmul, torch.randn(256, k, dtype=DTYPE, device="cuda"), w.T)
                       for w in _weights(n, k)])
    record(benchmark, roofline, name=f"linear {kind} sweep {name}", ms=best_small[first], candidates=results,
           best_small=best_small, best_large=best_large, chosen=chosen, matmul_ms_M256=cuda_time_ms(matmul))
    x, x_scale = _rows(1, k, w8a8)
    w, s = operands[0]
    benchmark.pedantic(_sync(lambda: gemm.linear(x, w, activation=activation, weight_scale=s, x_scale=x_scale)),
                       rounds=5, warmup_rounds=1)


@pytest.mark.parametrize("m", [1, 16, 64, 256])
def test_bench_linear_residual_norm(benchmark, roofline, m):
    """Ouro's down projection (split 4) into its residual norm: `linear_residual_norm` (the norm adds
    the partials) against `linear` + `residual_norm` (a reduction kernel between them) and the
    plain-torch layer (matmul + RMSNorm + add)."""
    from rlt_kernels import linear_residual_norm, norms

    n, k = 2048, 5632
    weights = _weights(n, k)
    x = torch.randn(m, k, dtype=DTYPE, device="cuda")
    res = torch.randn(m, n, dtype=DTYPE, device="cuda")
    w1, w2 = torch.ones(n, dtype=DTYPE, device="cuda"), torch.ones(n, dtype=DTYPE, device="cuda")
    fused = _cycling([functools.partial(linear_residual_norm, x, w, res, w1, w2, 1e-6) for w in weights])
    two = _cycling([lambda w=w: norms.residual_norm(gemm.linear(x, w), res, w1, w2, 1e-6) for w in weights])

    def torch_layer(w):
        y = torch.matmul(x, w.T)
        r = res + torch.nn.functional.rms_norm(y, (n,), w1, 1e-6)
        return r, torch.nn.functional.rms_norm(r, (n,), w2, 1e-6)

    layer = _cycling([functools.partial(torch_layer, w) for w in weights])
    ms, two_ms, layer_ms = cuda_time_ms(fused), cuda_time_ms(two), cuda_time_ms(layer)
    record(benchmark, roofline, name=f"linear_residual_norm ouro.down M={m}", ms=ms,
           bytes_moved=n * k * DTYPE.itemsize + (m * k + 3 * m * n) * DTYPE.itemsize, flops=2 * m * n * k,
           baseline_ms=layer_ms, unfused_ms=two_ms, vs_unfused=two_ms / ms, m=m)
    benchmark.pedantic(_sync(fused), rounds=10, warmup_rounds=1)
