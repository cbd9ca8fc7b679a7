"""Batch-invariant linear layer: ``out = x @ weight.T`` with an optional fused SwiGLU.

Contract shared by the Triton kernel and the torch reference:

* x [M, K] (bf16/fp16/fp32; fp64 reference only), weight [N, K] row-major (the nn.Linear
  layout), fp32 accumulation, result rounded to ``out.dtype`` (default x.dtype; pass an fp32
  ``out`` for fp32 logits or gate scores).
* ``activation="swiglu"``: weight is [2F, K] = [gate rows | up rows]; out [M, F] =
  silu(x @ gate.T) * (x @ up.T), computed from the fp32 accumulators and rounded once.
* Batch invariance: a row's output bits do not depend on M, on the other rows or on the row's
  position. Each output element is reduced over K in one order fixed by the weight shape: its
  K step and `split_k` (K cut into fixed ranges; each range's fp32 partial goes to a workspace
  and a second kernel adds the partials in range order). On the GPU the tile around that
  reduction follows M (decode, middle and prefill row classes); tensor-core dots keep the
  per-element order whatever the tile, which the GPU tests check bit for bit.
* FP8 weights: ``weight`` float8_e4m3fn [N, K] with ``weight_scale`` fp32 [N] (one scale per
  output channel, `rlt_kernels.fp8.quantize_weight_fp8`). The kernel widens each weight tile to
  x's dtype (exact: every e4m3 value is a bf16/fp16/fp32 value), accumulates in fp32 as for any
  weight and multiplies the accumulator by the channel's scale in the epilogue (before SwiGLU;
  gate and up rows have their own scales). The K reduction, its order and the tiles are those
  of an x.dtype weight of the same shape, so FP8 keeps the batch invariance above.
* W8A8: x float8_e4m3fn too, with ``x_scale`` fp32 [M] (one power-of-two scale per row,
  `rlt_kernels.fp8_rows`). The tiles go to the tensor cores as FP8 (no widening), the fp32
  accumulator is multiplied by the channel's scale and then by the row's (exact: a power of two);
  out defaults to bf16. The K reduction is fixed by the weight shape as for every weight, so W8A8
  is batch invariant too (its bits differ from W8A16's: other products).
* Skinny decode: at M <= SKINNY_ROWS (and up to DECODE_ROWS for weights whose decode tile is
  already SKINNY_BLOCK_N columns wide) the GPU computes each tile transposed, out^T = W x^T, so
  the weight tile is the tensor-core product's 64-row side and the batch rows its narrow side.
  Products and their order over K are those of the untransposed tile (same bits, GPU-tested).
* Middle and prefill rows (M > DECODE_ROWS) with 16-bit weights on Hopper: the tiles are fetched
  by the tensor memory accelerator (`_linear_tma_kernel`, TMA descriptors over x and the weight)
  into a deeper pipeline; same K steps and ranges, same bits. Unaligned tensors take the cp.async tile.
* ``active_rows`` (int32 [1] on the device): rows at or past the count are not written and
  their tiles are skipped inside the kernel, so a CUDA graph captured at a large bucket only
  pays for the live rows.

The Triton kernel (`linear`) takes bf16/fp16/fp32 x and a weight of the same dtype (or FP8 with
its scales) with a contiguous last dimension (row strides are free). Its launch configuration comes from
`linear_config(N, K, dtype, activation, rows)` -- the one place to tune after measuring.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from ._rows import active_count, by_row_chunks, compute_dtype
from ._dot import exact_dots, mma
from ._pdl import pdl_launch, wait_for_inputs
from ._triton import TensorDescriptor, check_launchable, interpreter_active, tl, triton
from ._widen import inline_widening, widen_fp8
from .fp8 import FP8_DTYPE
from .norms import silu_mul
from .split_partials import SplitPartials


def _matmul_rows(x, weight, activation, weight_scale):
    cd = compute_dtype(x.dtype)
    acc = x @ weight.to(cd).T
    if weight_scale is not None:
        acc = acc * weight_scale.to(cd)
    if activation == "swiglu":
        f = weight.shape[0] // 2
        acc = torch.nn.functional.silu(acc[:, :f]) * acc[:, f:]
    return acc


def linear_reference(x, weight, *, out=None, active_rows=None, activation=None, weight_scale=None, x_scale=None):
    """Torch reference of `linear` (row-invariant on CPU and GPU). An FP8 weight is widened to
    the compute dtype, multiplied into x and the product scaled per output channel; FP8 rows of x
    are first widened and multiplied by their scales (fp32, exact)."""
    if activation not in (None, "swiglu"):
        raise ValueError(f"activation must be None or 'swiglu', got {activation!r}")
    _check_scale(weight, weight_scale)
    _check_x_scale(x, weight, x_scale)
    n = weight.shape[0] // 2 if activation == "swiglu" else weight.shape[0]
    if out is None:
        out = torch.empty((x.shape[0], n), dtype=_default_out_dtype(x), device=x.device)
    m = active_count(active_rows, x.shape[0])
    if m:
        rows = x[:m].float() * x_scale[:m, None] if x_scale is not None else x[:m].to(compute_dtype(x.dtype))
        out[:m] = by_row_chunks(_matmul_rows, rows, weight, activation, weight_scale).to(out.dtype)
    return out


# ---------------------------------------------------------------------------------------------
# Launch configuration. The reduction plan (block_k, split_k) is a function of the weight shape
# alone. On the GPU the tile (rows, columns, warps, pipeline) also follows M: tensor-core dots
# accumulate each output element over K in the same order whatever the tile, so a row's bits do
# not change (H200 sweep: every candidate of one plan gives the same bits; GPU tests check it
# across the row classes). The interpreter and fp32 (FMA dots) always use the decode tile.
# ---------------------------------------------------------------------------------------------

# Rows per tile: 64 is the smallest tile Hopper runs on wgmma, and at decode (one row tile) it
# keeps the wasted tensor-core work at 64 FLOP per weight byte, well under what the SMs can issue
# while streaming weights at full HBM bandwidth. Prefill-sized M gets 128-row tiles.
BLOCK_M = 64
BLOCK_M_PREFILL = 128
# Row classes: M <= DECODE_ROWS is one row tile (decode); M > PREFILL_ROWS takes prefill tiles.
DECODE_ROWS = 64
PREFILL_ROWS = 512
# Decode column tiles: the narrowest whose CTAs (column tiles x split_k) still fit one wave of
# WAVE_CTAS (H200: 132 SMs) -- as many weight streams as the SMs take at once, no second wave --
# else the widest. (H200 sweep: Ouro o 2048 x 2048 takes 16 columns, 128 CTAs: 6.9 us at M = 1
# against 7.8 with 32; gate_up takes 64, 88 CTAs: 15.9 us against 18.5 with 32 and 176 CTAs.)
COLUMN_TILE_WIDTHS = (16, 32, 64, 128)
WAVE_CTAS = 132
# Skinny decode tiles (16-bit activations): out^T = W x^T with SKINNY_BLOCK_N weight rows against
# 16 batch rows (SKINNY_ROWS; 64 when M > 16), 256-byte K steps, same bits as the untransposed
# tile. At M = 64 only weights whose decode tile is already 64 columns wide take it (o keeps its
# 16-column tile there: 32 transposed CTAs are too few). Stages (H200 sweep, 24-32 rotating copies
# so every weight comes from HBM, docs/perf/kernels.md): a program keeps up to
# SKINNY_BYTES_IN_FLIGHT of 16-bit tiles in flight, 3..6 stages, which is what the 32-128 programs
# of a decode launch need to stream near bandwidth. us at M = 1, 3 stages -> this rule, same bits:
# qkv 10.2 -> 8.9, o 8.5 -> 6.2, gate_up 15.8 (4 stages) -> 14.7, down 9.8 -> 8.6; Huginn proj
# 5280 x 5280 35.8 -> 19.3 (with 256-byte K steps, which an unsplit weight always keeps: its one K
# range does not depend on the step). FP8 weights are limited by widening the tile in registers,
# not by bytes in flight: they keep FP8_SKINNY_BYTES_IN_FLIGHT, and one-accumulator weights up to
# FP8_WIDE_STEP_MAX_K take 256-element K steps (H200 sweep with the integer widening, same bits, us
# at M = 1: qkv 11.0 -> 10.0, o 10.6 -> 9.5 with 256 x 3 stages; gate_up 18.0, down 9.6 and Huginn
# proj 23.5 with 128 x 3-4 stages, where 256-element steps were 3-17% slower). The 64-row tile
# (M = 17..64) keeps up to SKINNY_WIDE_BYTES_IN_FLIGHT: us at M = 64, 3 stages -> this rule, same
# bits: qkv 11.4 -> 9.8, down 12.4 -> 11.0 (5 stages each), gate_up 16.7 (3 stages, unchanged).
SKINNY_ROWS = 16
SKINNY_BLOCK_N = 64
SKINNY_K_STEP_BYTES = 256
SKINNY_STAGES = 3
SKINNY_MAX_STAGES = 6
SKINNY_BYTES_IN_FLIGHT = 120 * 1024
SKINNY_WIDE_BYTES_IN_FLIGHT = 160 * 1024
# SwiGLU's 16-bit skinny tiles stream two weight tiles (gate and up rows) and keep at least
# SWIGLU_SKINNY_STAGES stages where they fit an SM's shared memory (the byte rule gives 3). H200, the
# decode chain of perf.bench_decode_chain (96 layer-loops in one graph, same bits), ms at batch
# 1 / 16 / 64: 4.68 / 5.48 / 8.28 -> 4.57 / 5.39 / 8.15. FP8 weights keep their rule (3 and 4 stages
# timed alike at M = 1).
SWIGLU_SKINNY_STAGES = 4
# The 64-row skinny tile of 16-bit weights and rows (M = 17..64) is fetched by TMA on Hopper
# (`_linear_tma_kernel` with SWAP_AB: same tile, K steps and stages, same bits). H200, the decode chain
# of perf.bench_decode_chain (96 layer-loops in one graph), ms at batch 64, cp.async -> TMA, three
# rounds: 8.047 / 8.039 / 8.039 -> 7.784 / 7.785 / 7.785. The 16-row tile (M <= 16) keeps cp.async:
# alone, from HBM, its TMA form was faster with its own stages (M = 1, us: qkv 9.1 -> 8.4, gate_up
# 15.8 -> 13.5 with 128-byte K steps, LM head 51.2 -> 48.5, Huginn mlp_proj 59.7 -> 47.8), yet the chain
# at batch 1 / 4 / 16 went 4.32 / 4.58 / 5.29 -> 4.43 / 4.70 / 5.34 ms (docs/perf/kernels.md).
SKINNY_WIDE_TMA = True
FP8_SKINNY_BYTES_IN_FLIGHT = 48 * 1024
FP8_WIDE_STEP_MAX_K = 4096
# Column tile of the middle row class.
MID_BLOCK_N = 64
# Split-K weights in the middle class take 128 x 64 tiles with 64-element K steps, 8 warps, 4 stages
# (H200 sweep, Ouro down 2048 x 5632 at M = 256: 22.9 -> 17.9 us, same bits).
MID_SPLIT_BLOCK_K = 64
# Bytes of one K step of a weight row: wide steps for narrow (<= NARROW_COLUMNS outputs) or deep
# (K >= 2 N) weights, whose decode tiles are few and long.
K_STEP_BYTES_NARROW = 256
K_STEP_BYTES_WIDE = 128
NARROW_COLUMNS = 2048
# Deep, skinny weights (K >= 2 N, K >= SPLIT_MIN_K, N <= SPLIT_MAX_COLUMNS) split K in SPLIT_K
# ranges: enough CTAs at decode (Ouro down: 16.4 -> 10.5 us at M = 1, also faster at M = 256).
SPLIT_K = 4
SPLIT_MIN_K = 4096
SPLIT_MAX_COLUMNS = 4096
# Narrow weights whose transposed decode tiles would be fewer than WAVE_CTAS / SPLIT_K programs (Ouro
# o 2048 x 2048: 32) also split K in SPLIT_K ranges of at least WAVE_SPLIT_MIN_STEPS K steps: a decode
# GEMV program streams its weight slice at about 40 GB/s whatever its tile, so 32 programs read o at a
# third of the bandwidth (H200, o from HBM at M = 1: 6.4 -> 4.9 us; decode chain at batch 1 4.79 ->
# 4.65 ms). These "wave splits" exist for decode only: every TMA launch of more rows adds the ranges
# inside its tile (`_tma_k_range` IN_RANGES: same range order, same bits), so it writes no partials;
# that costs o 5-12% at 128-1024 rows and about 35% at 2048-4096 (27.2 -> 37.6 us at 2048).
WAVE_SPLIT_MIN_STEPS = 4
# Shared memory for the software pipeline (H100/H200 allow 227 KiB per CTA). Decode takes as many
# stages as fit (2..MAX_STAGES); the middle class 3..4 stages within MID_STAGE_BYTES, so several
# CTAs share an SM; prefill tiles take PREFILL_STAGES when they fit, else the middle tile.
SMEM_BUDGET_BYTES = 160 * 1024
MAX_STAGES = 5
MID_STAGE_BYTES = 72 * 1024
PREFILL_STAGES = 3
# Middle and prefill row classes with 16-bit weights: tiles fetched by TMA (`_linear_tma_kernel`).
# Candidates (block_m, block_n, block_k, warps, stages) by accumulators, widest first; a launch takes
# the first whose programs fill at least TMA_WAVE_FILL of one wave of WAVE_CTAS and of their last wave
# (counting the programs that share an SM's shared memory), else the last. H200 sweep (same bits as
# every other tile, docs/perf/kernels.md), Ouro weights, us at M = 128 / 256 / 512 / 2048, cp.async
# tiles -> TMA tiles: qkv 13.5 / 17.7 / 33.5 / 93.0 -> 10.8 / 14.1 / 26.3 / 73.6, o 10.0 / 10.0 / 13.4 /
# 48.3 -> 6.4 / 7.0 / 9.1 / 24.8, gate_up 23.1 / 28.4 / 53.7 / 170.8 -> 21.6 / 23.0 / 42.2 / 142.8,
# down (split 4) 13.4 / 17.6 / 32.0 / 164.0 -> 11.6 / 16.2 / 28.7 / 105.8.
# FP8 weights (widened in registers either way) take TMA tiles only for prefill rows without SwiGLU:
# us at M = 2048, cp.async -> TMA, same bits: Ouro qkv 117.6 -> 104.8, o 77.8 -> 37.2, down 227.7 ->
# 123.6, Huginn mlp_proj 1641 -> 836; but gate_up 267 -> 294, and in the middle class qkv 26.2 -> 33.8
# and gate_up 45.4 -> 43.8 at M = 256 (an FP8 engine with every class on TMA: batch 256 9,537 -> 9,256 tok/s).
TMA_MID_TILES = {1: ((64, 256, 64, 4, 5), (64, 128, 128, 4, 4), (64, 128, 64, 4, 3), (64, 64, 128, 4, 5)),
                 2: ((64, 128, 64, 4, 5), (64, 64, 64, 4, 3))}
TMA_PREFILL_TILES = {1: ((128, 128, 64, 8, 3),), 2: ((128, 128, 64, 8, 4),)}
# Prefill rows of a split weight (Ouro down and o) add their K ranges in the tile, which keeps a second
# fp32 tile (the finished ranges' sum): 160 registers at 128 x 128 x 64 (sm_90), one program per SM,
# whose 3-stage pipeline no longer hides the loads. Keyed by the weight's bytes per element. H200,
# us at M = 1,024 / 2,048 / 4,096, 128 x 128 x 64 (3 stages) -> these tiles, same bits in every
# candidate (docs/perf/kernels.md): bf16 down 49.4 / 100.6 / 197.2 -> 36.8 / 73.0 / 148.2, o 19.8 /
# 36.8 / 71.8 -> 16.2 / 31.2 / 61.1; FP8 weights down 82.7 / 162.2 / 319.0 -> 61.8 / 138.5 / 215.9,
# o 32.7 / 64.2 / 125.1 -> 25.4 / 54.3 / 85.4.
TMA_PREFILL_IN_TILE_TILES = {2: ((64, 256, 64, 8, 5),), 1: ((128, 64, 64, 4, 3),)}
TMA_WAVE_FILL = 0.7
# W8A8 middle rows of a deep split weight (65-512 rows; Ouro down) take a TMA tile that adds
# the K ranges itself wherever one fills the waves (Ouro down at 256 rows: 64 x 64 x 256, 5 stages,
# 128 programs), instead of writing SPLIT_K fp32 partials that the residual norm reads back (8 MiB
# each way per call at 256 rows). Same ranges in the same order, so the same bits. Rows where no
# such tile fills the waves keep the partials (Ouro down: in the tile at 129-256 and 321-512 rows).
# H100, down into its residual norm, us at 256 / 384 rows: 16.8 / 22.8 -> 13.8 / 16.6; the W8A8 +
# FP8 K/V engine at batch 256 15.57 -> 15.14 ms a step. bf16 rows gain 1% from the same tile at 256
# rows (20.2 -> 20.0) and keep theirs.
W8A8_MIDDLE_IN_TILE = True
SM_SHARED_BYTES = 227 * 1024  # shared memory an H100/H200 SM gives its resident programs
# Row tiles that share a column band in the launch order (L2 reuse of weight tiles at large M;
# it only reorders programs, never changes a tile's arithmetic).
GROUP_M = 8


# Tile of the split-K reduction kernel (elementwise sums: any tile gives the same bits).
REDUCE_BLOCK_M = 16
REDUCE_BLOCK_N = 128


@dataclass(frozen=True)
class LinearConfig:
    """Tile shape and pipeline of the `linear` kernel. split_k > 1 cuts K into that many ranges
    of whole BLOCK_K steps (more CTAs for skinny weights at decode)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = GROUP_M
    split_k: int = 1
    swap_ab: bool = False  # tiles computed transposed (skinny decode): block_m batch rows x block_n weight rows
    tma: bool = False  # x and weight tiles fetched by the tensor memory accelerator (Hopper, `_linear_tma_kernel`)
    reduce_in_tile: bool = False  # a TMA tile runs every K range itself and adds them in range order (no partials)

    def k_range(self, k: int) -> int:
        """Keys of K per split: whole BLOCK_K steps, the last range possibly shorter."""
        steps = -(-k // self.block_k)
        return -(-steps // self.split_k) * self.block_k

    def k_bounds(self, k: int) -> tuple:
        """Where the K ranges of a launch start and end (0, ..., k): what decides the bits."""
        r = self.k_range(k)
        return (tuple(range(0, k, r)) if r else ()) + (k,)


@functools.lru_cache(maxsize=None)
def linear_config(n: int, k: int, dtype: torch.dtype, activation: str | None = None,
                  rows: int | None = None, weight_dtype: torch.dtype | None = None, tma: bool = True,
                  smem: int = SM_SHARED_BYTES) -> LinearConfig:
    """The launch configuration for a weight [n, k] against activations of ``dtype`` (n = 2F for
    swiglu; ``weight_dtype`` float8_e4m3fn for FP8 weights, None: ``dtype``, so float8_e4m3fn
    ``dtype`` alone is W8A8) and a launch of ``rows``
    rows on the GPU (None: the decode tile); ``tma``: whether TMA can fetch the tiles (the middle and
    prefill classes of 16-bit weights then take `_tma_tile`); ``smem``: the shared memory a program
    may use on the device (`shared_memory`; the constants above are the H100/H200's, and a device
    with less keeps every pipeline within it, with fewer stages or other tiles: stages and tiles
    never change the bits, the K steps and ranges stay). block_k and split_k depend on the
    weight alone, which is what makes `linear` batch invariant. Examples (bf16, decode / M = 256 /
    M = 2048, the last two TMA): Ouro qkv 64x64x64 s5 / 64x256x64 s5 / 128x128x64 s3; o 64x64x128 s5 split 4 /
    64x64x128 s5 split 4 in tile / 64x256x64 s5 (8 warps) split 4 in tile; down 64x64x128 split 4 / 64x256x64 s5
    split 4 / 64x256x64 s5 (8 warps) split 4 in tile; gate_up swiglu 64x(2x64)x64 s5 / s3 / 128x(2x128)x64 s4."""
    _check_activation(activation)
    accumulators = 2 if activation == "swiglu" else 1
    n_out = n // accumulators
    elem = dtype.itemsize
    deep = k >= 2 * n_out
    step_bytes = K_STEP_BYTES_NARROW if deep or n_out <= NARROW_COLUMNS else K_STEP_BYTES_WIDE
    block_k = max(16, min(step_bytes // elem, triton.next_power_of_2(max(k, 1))))
    deep_split = deep and k >= SPLIT_MIN_K and n_out <= SPLIT_MAX_COLUMNS
    wave_split = (not deep_split and triton.cdiv(n_out, SKINNY_BLOCK_N) * SPLIT_K <= WAVE_CTAS
                  and triton.cdiv(k, block_k) >= SPLIT_K * WAVE_SPLIT_MIN_STEPS)
    split_k = SPLIT_K if deep_split or wave_split else 1

    def stage_bytes(block_m, block_n):
        return (block_m + accumulators * block_n) * block_k * elem

    def warps(block_n):
        return 4 if accumulators * block_n <= 128 else 8

    block_n = next((w for w in COLUMN_TILE_WIDTHS if triton.cdiv(n_out, w) * split_k <= WAVE_CTAS),
                   COLUMN_TILE_WIDTHS[-1])
    budget = min(SMEM_BUDGET_BYTES, smem)
    stages = max(2, min(MAX_STAGES, budget // stage_bytes(BLOCK_M, block_n)))
    decode = LinearConfig(BLOCK_M, block_n, block_k, warps(block_n), stages, split_k=split_k)
    if rows is None or dtype == torch.float32:
        return decode
    if rows <= SKINNY_ROWS or (rows <= DECODE_ROWS and block_n >= SKINNY_BLOCK_N):
        w_elem = elem if weight_dtype is None else weight_dtype.itemsize
        return _skinny_config(decode, k, elem, w_elem, accumulators, SKINNY_ROWS if rows <= SKINNY_ROWS else BLOCK_M,
                              smem, tma=tma and weight_dtype is None and elem == 2)
    if rows <= DECODE_ROWS:
        return decode
    if tma and (weight_dtype is None or (rows > PREFILL_ROWS and accumulators == 1)):
        w_elem = elem if weight_dtype is None else weight_dtype.itemsize
        tile = None
        if W8A8_MIDDLE_IN_TILE and elem == 1 and deep_split and rows <= PREFILL_ROWS:
            tile = _tma_tile(n_out, k, rows, elem, w_elem, accumulators, decode, in_tile=True, smem=smem,
                             must_fill=True)
        if tile is None:
            tile = _tma_tile(n_out, k, rows, elem, w_elem, accumulators, decode,
                             in_tile=rows > PREFILL_ROWS or wave_split, smem=smem)
        if tile is not None:
            return tile
    if deep_split and rows <= PREFILL_ROWS:  # same K ranges, 128-row tiles: one weight pass per 128 rows
        split_tile = LinearConfig(BLOCK_M_PREFILL, MID_BLOCK_N, MID_SPLIT_BLOCK_K, 8, 4, split_k=split_k)
        split_bytes = 4 * (BLOCK_M_PREFILL + accumulators * MID_BLOCK_N) * MID_SPLIT_BLOCK_K * elem
        if split_tile.k_range(k) == decode.k_range(k) and split_bytes <= budget:
            return split_tile
    block_n = 128 // accumulators
    if rows > PREFILL_ROWS and PREFILL_STAGES * stage_bytes(BLOCK_M_PREFILL, block_n) <= budget:
        return LinearConfig(BLOCK_M_PREFILL, block_n, block_k, 8, PREFILL_STAGES, split_k=split_k)
    stages = max(3, min(4, min(MID_STAGE_BYTES, smem) // stage_bytes(BLOCK_M, MID_BLOCK_N)))
    return LinearConfig(BLOCK_M, MID_BLOCK_N, block_k, warps(MID_BLOCK_N), stages, split_k=split_k)


def _tma_tile(n_out: int, k: int, rows: int, elem: int, w_elem: int, accumulators: int, decode: LinearConfig,
              in_tile: bool, smem: int = SM_SHARED_BYTES, must_fill: bool = False):
    """The TMA tile of a launch of ``rows`` (> DECODE_ROWS) rows: the first candidate of its row class
    that keeps the weight's K ranges and fills the GPU's waves (TMA_WAVE_FILL), else the last candidate
    (None with ``must_fill``); None when no candidate keeps the K ranges within ``smem``. in_tile: a
    split weight's tile adds its K ranges itself (no partials). The candidates' K steps are for 2-byte
    rows; FP8 rows (W8A8) take as many bytes, twice the elements, or the decode tile's K step where
    theirs would move a split weight's ranges (Ouro down)."""
    adds_ranges = in_tile and decode.split_k > 1
    if rows <= PREFILL_ROWS:
        shapes = TMA_MID_TILES[accumulators]
    elif adds_ranges and accumulators == 1 and elem == 2:
        shapes = TMA_PREFILL_IN_TILE_TILES[w_elem]
    else:
        shapes = TMA_PREFILL_TILES[accumulators]
    tiles = [LinearConfig(bm, bn, bk * 2 // elem, warps, stages, split_k=decode.split_k, tma=True,
                          reduce_in_tile=adds_ranges)
             for bm, bn, bk, warps, stages in shapes]
    if elem == 1:
        tiles = [t if t.k_bounds(k) == decode.k_bounds(k) else dataclasses.replace(t, block_k=decode.block_k)
                 for t in tiles]
    tiles = [t for t in tiles if t.k_bounds(k) == decode.k_bounds(k)
             and t.num_stages * (t.block_m * elem + accumulators * t.block_n * w_elem) * t.block_k <= smem]
    for t in tiles:
        stage_bytes = (t.block_m * elem + accumulators * t.block_n * w_elem) * t.block_k
        resident = max(1, smem // (t.num_stages * stage_bytes))
        programs = triton.cdiv(rows, t.block_m) * triton.cdiv(n_out, t.block_n) * (1 if t.reduce_in_tile else t.split_k)
        slots = WAVE_CTAS * resident
        if programs >= TMA_WAVE_FILL * WAVE_CTAS and programs >= TMA_WAVE_FILL * triton.cdiv(programs, slots) * slots:
            return t
    return tiles[-1] if tiles and not must_fill else None


def _skinny_config(decode: LinearConfig, k: int, elem: int, w_elem: int, accumulators: int,
                   block_m: int, smem: int = SM_SHARED_BYTES, tma: bool = False) -> LinearConfig:
    """The transposed decode tile: K steps of SKINNY_K_STEP_BYTES of 16-bit weight row (FP8: twice
    the elements for one-accumulator weights up to FP8_WIDE_STEP_MAX_K) unless they would move the
    weight's split ranges; stages as many as keep the tile's bytes in flight (x in ``elem`` bytes,
    the weight in ``w_elem``). W8A8 (FP8 x and weight: nothing to widen) follows the 16-bit rules
    in bytes. ``tma``: TMA can fetch the tiles of these 16-bit weights and rows; the 64-row tile then
    takes it (SKINNY_WIDE_TMA)."""
    widened = w_elem < elem
    step = SKINNY_K_STEP_BYTES // elem
    if widened and accumulators == 1 and k <= FP8_WIDE_STEP_MAX_K:
        step *= 2
    if elem == 1 and accumulators == 2:
        step //= 2  # W8A8 SwiGLU: 128-element steps, 6 stages (H200, Ouro gate_up at M = 1: 9.55 -> 8.11 us)
    block_k = max(decode.block_k, min(step, triton.next_power_of_2(max(k, 1))))
    if -(-k // block_k) < decode.split_k or LinearConfig(block_m, SKINNY_BLOCK_N, block_k, 4, 1,
                                                         split_k=decode.split_k).k_bounds(k) != decode.k_bounds(k):
        block_k = decode.block_k
    stage_bytes = (block_m * elem + accumulators * SKINNY_BLOCK_N * w_elem) * block_k
    in_flight = SKINNY_BYTES_IN_FLIGHT if block_m == SKINNY_ROWS else SKINNY_WIDE_BYTES_IN_FLIGHT
    if widened:
        in_flight = FP8_SKINNY_BYTES_IN_FLIGHT
    stages = max(2, min(SKINNY_MAX_STAGES, min(in_flight, smem) // stage_bytes))
    if SKINNY_STAGES * stage_bytes <= smem:
        stages = max(stages, SKINNY_STAGES)
    if accumulators == 2 and not widened and SWIGLU_SKINNY_STAGES * stage_bytes <= smem:
        stages = max(stages, SWIGLU_SKINNY_STAGES)
    return LinearConfig(block_m, SKINNY_BLOCK_N, block_k, 4, stages, split_k=decode.split_k, swap_ab=True,
                        tma=tma and SKINNY_WIDE_TMA and block_m == BLOCK_M)


def _check_activation(activation) -> None:
    if activation not in (None, "swiglu"):
        raise ValueError(f"activation must be None or 'swiglu', got {activation!r}")


def _default_out_dtype(x) -> torch.dtype:
    """out's dtype when the caller gives none: x's, bf16 for FP8 rows."""
    return torch.bfloat16 if x.dtype == FP8_DTYPE else x.dtype


def _check_x_scale(x, weight, x_scale) -> None:
    """FP8 rows of x need an FP8 weight and fp32 scales [M]; other x take none."""
    if x.dtype != FP8_DTYPE:
        if x_scale is not None:
            raise ValueError(f"x_scale is for float8_e4m3fn x (W8A8), got a {x.dtype} x")
        return
    if weight.dtype != FP8_DTYPE:
        raise ValueError(f"float8_e4m3fn x (W8A8) needs a float8_e4m3fn weight, got {weight.dtype}")
    if (x_scale is None or x_scale.dtype != torch.float32 or tuple(x_scale.shape) != (x.shape[0],)
            or not x_scale.is_contiguous()):
        got = None if x_scale is None else f"{x_scale.dtype} {tuple(x_scale.shape)}"
        raise ValueError(f"float8_e4m3fn x [{x.shape[0]}, K] needs x_scale: a contiguous fp32 tensor [{x.shape[0]}] "
                         f"(one scale per row, rlt_kernels.fp8_rows), got {got}")


def _check_scale(weight, weight_scale) -> None:
    """An FP8 weight needs fp32 scales [N]; other weights take none."""
    if weight.dtype != FP8_DTYPE:
        if weight_scale is not None:
            raise ValueError(f"weight_scale is for float8_e4m3fn weights, got a {weight.dtype} weight")
        return
    if (weight_scale is None or weight_scale.dtype != torch.float32 or weight_scale.dim() != 1
            or weight_scale.shape[0] != weight.shape[0] or not weight_scale.is_contiguous()):
        got = None if weight_scale is None else f"{weight_scale.dtype} {tuple(weight_scale.shape)}"
        raise ValueError(f"a float8_e4m3fn weight [{weight.shape[0]}, K] needs weight_scale: a contiguous fp32 "
                         f"tensor [{weight.shape[0]}] (one scale per output channel), got {got}")


# ---------------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------------


@triton.jit
def _store_result(out_ptr, scale_ptr, x_scale_ptr, rows, cols, m, n_out, stride_out, acc_g, acc_u, io_mask,
                  SWIGLU: tl.constexpr, HAS_SCALE: tl.constexpr, X_FP8: tl.constexpr):
    """out[rows, cols] = acc_g (or silu(acc_g) * acc_u) from fp32, rounded once to out's dtype;
    with FP8 weights each accumulator is first multiplied by its output channel's scale, and with
    FP8 rows (W8A8) then by its row's scale."""
    if HAS_SCALE:
        col_ok = cols < n_out
        acc_g = acc_g * tl.load(scale_ptr + cols, mask=col_ok, other=1.0)[None, :]
        if SWIGLU:
            acc_u = acc_u * tl.load(scale_ptr + n_out + cols, mask=col_ok, other=1.0)[None, :]
    if X_FP8:
        row_scale = tl.load(x_scale_ptr + rows, mask=rows < m, other=1.0)[:, None]
        acc_g = acc_g * row_scale
        if SWIGLU:
            acc_u = acc_u * row_scale
    if SWIGLU:
        result = silu_mul(acc_g, acc_u)
    else:
        result = acc_g
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(out_ptrs, result.to(out_ptr.dtype.element_ty), mask=io_mask)


@triton.jit
def _tile_product(a, w, acc, SWAP_AB: tl.constexpr, PRECISION: tl.constexpr, EXACT: tl.constexpr):
    """acc + a @ w (a [BLOCK_M, BLOCK_K], w [BLOCK_K, BLOCK_N]), or with SWAP_AB the transposed
    acc + w @ a (w [BLOCK_N, BLOCK_K], a [BLOCK_K, BLOCK_M])."""
    if SWAP_AB:
        acc = mma(w, a, acc, PRECISION, EXACT)
    else:
        acc = mma(a, w, acc, PRECISION, EXACT)
    return acc


@triton.jit
def _dot_operand(w, a, X_FP8: tl.constexpr, HAS_SCALE: tl.constexpr, WIDEN_INLINE: tl.constexpr,
                 EXACT: tl.constexpr):
    """A weight tile as the product takes it: W8A8 tiles stay FP8 (fp32 under the interpreter's
    exact dots, which cannot take FP8), FP8 weights against 16-bit rows are widened to a's dtype."""
    if X_FP8:
        if EXACT:
            w = w.to(tl.float32)
    elif HAS_SCALE:
        w = widen_fp8(w, a, WIDEN_INLINE)  # exact; the scale is applied in the epilogue
    return w


@triton.jit
def _row_operand(a, X_FP8: tl.constexpr, EXACT: tl.constexpr):
    """An x tile as the product takes it (FP8 rows widened to fp32 only for exact dots)."""
    if X_FP8 and EXACT:
        a = a.to(tl.float32)
    return a


@triton.jit
def _tile_ids(m, n_out, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program_id(0) in the grouped launch order: GROUP_M row tiles walk
    the column tiles together (L2 reuse of weight tiles at large M)."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(m, BLOCK_M)
    tiles_n = tl.cdiv(n_out, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows


@triton.jit
def _live_rows(m, active_ptr, HAS_ACTIVE: tl.constexpr):
    """Rows of the launch that are live: m, or fewer by the device-side active count."""
    live = m
    if HAS_ACTIVE:
        live = tl.minimum(live, tl.load(active_ptr).to(tl.int32))
    return live


@triton.jit
def _k_span(k, k_range, SPLIT_K: tl.constexpr):
    """K range of this program: all of K, or split program_id(1)'s range of whole K steps."""
    if SPLIT_K == 1:
        k_lo = 0
        k_hi = k
    else:
        k_lo = tl.program_id(1) * k_range
        k_hi = tl.minimum(k_lo + k_range, k)
    return k_lo, k_hi


@triton.jit
def _store_tile(out_ptr, ws_ptr, scale_ptr, x_scale_ptr, rows, cols, m, n_out, stride_out, acc_g, acc_u, io_mask,
                SWIGLU: tl.constexpr, HAS_SCALE: tl.constexpr, X_FP8: tl.constexpr, SPLIT_K: tl.constexpr):
    """The tile's result (`_store_result`), or with split K its fp32 partials: workspace
    [SPLIT_K, m, n_acc] with gate columns first, then up."""
    if SPLIT_K == 1:
        _store_result(out_ptr, scale_ptr, x_scale_ptr, rows, cols, m, n_out, stride_out, acc_g, acc_u, io_mask, SWIGLU,
                      HAS_SCALE, X_FP8)
    else:
        n_acc = n_out * (2 if SWIGLU else 1)
        ws_rows = (tl.program_id(1) * m + rows).to(tl.int64)[:, None] * n_acc
        tl.store(ws_ptr + ws_rows + cols[None, :], acc_g, mask=io_mask)
        if SWIGLU:
            tl.store(ws_ptr + ws_rows + n_out + cols[None, :], acc_u, mask=io_mask)


@triton.jit(do_not_specialize=["m"])
def _linear_kernel(
    x_ptr, w_ptr, scale_ptr, x_scale_ptr, out_ptr, ws_ptr, active_ptr, m, n_out, k, k_range, stride_x, stride_w,
    stride_out, HAS_ACTIVE: tl.constexpr, SWIGLU: tl.constexpr, HAS_SCALE: tl.constexpr, X_FP8: tl.constexpr,
    WIDEN_INLINE: tl.constexpr,
    EXACT_DOT: tl.constexpr, PRECISION: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, SWAP_AB: tl.constexpr, PDL: tl.constexpr,
):
    pid_m, pid_n = _tile_ids(m, n_out, BLOCK_M, BLOCK_N, GROUP_M)
    wait_for_inputs(PDL)
    live = _live_rows(m, active_ptr, HAS_ACTIVE)
    if pid_m * BLOCK_M >= live:
        return  # dead row tile (graph captured at a larger bucket): no loads, no stores
    k_lo, k_hi = _k_span(k, k_range, SPLIT_K)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < live
    col_ok = cols < n_out
    if SWAP_AB:  # transposed tiles: acc [BLOCK_N, BLOCK_M] = weight tile [BLOCK_N, BLOCK_K] @ x^T [BLOCK_K, BLOCK_M]
        x_ptrs = x_ptr + rows.to(tl.int64)[None, :] * stride_x + (k_lo + ks)[:, None]
        g_ptrs = w_ptr + cols.to(tl.int64)[:, None] * stride_w + (k_lo + ks)[None, :]
        u_ptrs = w_ptr + (cols + n_out).to(tl.int64)[:, None] * stride_w + (k_lo + ks)[None, :]
        acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:  # weight tiles loaded as [BLOCK_K, BLOCK_N] views of the row-major [N, K] weight
        x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_x + (k_lo + ks)[None, :]
        g_ptrs = w_ptr + cols.to(tl.int64)[None, :] * stride_w + (k_lo + ks)[:, None]
        u_ptrs = w_ptr + (cols + n_out).to(tl.int64)[None, :] * stride_w + (k_lo + ks)[:, None]
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if SWAP_AB:
            x_mask = row_ok[None, :]
            w_mask = col_ok[:, None]
            if not EVEN_K:
                x_mask = x_mask & ((k0 + ks) < k_hi)[:, None]
                w_mask = w_mask & ((k0 + ks) < k_hi)[None, :]
        else:
            x_mask = row_ok[:, None]
            w_mask = col_ok[None, :]
            if not EVEN_K:
                x_mask = x_mask & ((k0 + ks) < k_hi)[None, :]
                w_mask = w_mask & ((k0 + ks) < k_hi)[:, None]
        a = tl.load(x_ptrs, mask=x_mask, other=0.0)
        g = _dot_operand(tl.load(g_ptrs, mask=w_mask, other=0.0), a, X_FP8, HAS_SCALE, WIDEN_INLINE, EXACT_DOT)
        if SWIGLU:
            u = _dot_operand(tl.load(u_ptrs, mask=w_mask, other=0.0), a, X_FP8, HAS_SCALE, WIDEN_INLINE, EXACT_DOT)
        a = _row_operand(a, X_FP8, EXACT_DOT)
        acc_g = _tile_product(a, g, acc_g, SWAP_AB, PRECISION, EXACT_DOT)
        if SWIGLU:
            acc_u = _tile_product(a, u, acc_u, SWAP_AB, PRECISION, EXACT_DOT)
            u_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
    if SWAP_AB:
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)
    io_mask = row_ok[:, None] & col_ok[None, :]
    _store_tile(out_ptr, ws_ptr, scale_ptr, x_scale_ptr, rows, cols, m, n_out, stride_out, acc_g, acc_u, io_mask, SWIGLU,
                HAS_SCALE, X_FP8, SPLIT_K)


@triton.jit
def _accumulator(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    """A zero fp32 tile accumulator: [BLOCK_M, BLOCK_N], or [BLOCK_N, BLOCK_M] for transposed products."""
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    return acc


@triton.jit
def _tma_k_range(x_desc, w_desc, row0, col0, n_out, k_lo, k_hi, k_range, SWIGLU: tl.constexpr,
                 HAS_SCALE: tl.constexpr, X_FP8: tl.constexpr, WIDEN_INLINE: tl.constexpr, EXACT_DOT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                 IN_RANGES: tl.constexpr, SWAP_AB: tl.constexpr):
    """fp32 sums over K in [k_lo, k_hi) of the tile at (row0, col0), gate (and up with SWIGLU)
    accumulators [BLOCK_M, BLOCK_N], fetched by TMA into a STAGES-deep pipeline. SWAP_AB: the
    product is taken transposed, W x^T with the weight tile on the left (skinny decode tiles, as
    `_linear_kernel`'s), and the sums transposed back. IN_RANGES: the
    sums of each k_range-long range (ranges start at multiples of k_range) added in range order,
    in the same one pipelined loop: each range accumulates from zero and joins the sum at its last
    step. (One pipelined loop per range restarts the pipeline at every range: same bits, H200 o at
    M = 256 10.6 against 7.8 us.)"""
    acc_g = _accumulator(BLOCK_M, BLOCK_N, SWAP_AB)
    acc_u = _accumulator(BLOCK_M, BLOCK_N, SWAP_AB)
    if IN_RANGES:
        sum_g = _accumulator(BLOCK_M, BLOCK_N, SWAP_AB)
        sum_u = _accumulator(BLOCK_M, BLOCK_N, SWAP_AB)
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
        a = x_desc.load([row0, k0])
        g = _dot_operand(w_desc.load([col0, k0]), a, X_FP8, HAS_SCALE, WIDEN_INLINE, EXACT_DOT)
        if SWIGLU:
            u = _dot_operand(w_desc.load([n_out + col0, k0]), a, X_FP8, HAS_SCALE, WIDEN_INLINE, EXACT_DOT)
        a = _row_operand(a, X_FP8, EXACT_DOT)
        if SWAP_AB:
            acc_g = mma(g, tl.trans(a), acc_g, "tf32", EXACT_DOT)
            if SWIGLU:
                acc_u = mma(u, tl.trans(a), acc_u, "tf32", EXACT_DOT)
        else:
            acc_g = mma(a, tl.trans(g), acc_g, "tf32", EXACT_DOT)
            if SWIGLU:
                acc_u = mma(a, tl.trans(u), acc_u, "tf32", EXACT_DOT)
        if IN_RANGES:
            if ((k0 + BLOCK_K) % k_range == 0) | (k0 + BLOCK_K >= k_hi):  # the range's last step
                sum_g += acc_g
                acc_g = _accumulator(BLOCK_M, BLOCK_N, SWAP_AB)
                if SWIGLU:
                    sum_u += acc_u
                    acc_u = _accumulator(BLOCK_M, BLOCK_N, SWAP_AB)
    if IN_RANGES:
        acc_g, acc_u = sum_g, sum_u
    if SWAP_AB:
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)
    return acc_g, acc_u


@triton.jit(do_not_specialize=["m"])
def _linear_tma_kernel(
    x_desc, w_desc, scale_ptr, x_scale_ptr, out_ptr, ws_ptr, active_ptr, m, n_out, k, k_range, stride_out,
    HAS_ACTIVE: tl.constexpr, SWIGLU: tl.constexpr, HAS_SCALE: tl.constexpr, X_FP8: tl.constexpr,
    WIDEN_INLINE: tl.constexpr,
    EXACT_DOT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, STAGES: tl.constexpr,
    REDUCE_IN_TILE: tl.constexpr, SWAP_AB: tl.constexpr, PDL: tl.constexpr,
):
    """`_linear_kernel`'s tile with both operands fetched through TMA descriptors
    (x [m, k] in [BLOCK_M, BLOCK_K] boxes, weight [n, k] in [BLOCK_N, BLOCK_K] boxes; the
    accelerator zero-fills past either shape) into a STAGES-deep pipeline; FP8 weight tiles are
    widened in registers as in `_linear_kernel`. Same K steps, ranges and fp32 accumulation order,
    so the same bits as `_linear_kernel` for the same reduction plan. REDUCE_IN_TILE: the program
    runs all SPLIT_K ranges of its tile in turn and adds their fp32 sums in range order, as
    `_split_reduce_kernel` adds the partials (same bits, no partials written). SWAP_AB: the
    transposed product of `_linear_kernel`'s skinny decode tiles (same bits)."""
    pid_m, pid_n = _tile_ids(m, n_out, BLOCK_M, BLOCK_N, GROUP_M)
    wait_for_inputs(PDL)
    live = _live_rows(m, active_ptr, HAS_ACTIVE)
    if pid_m * BLOCK_M >= live:
        return
    row0 = pid_m * BLOCK_M
    col0 = pid_n * BLOCK_N
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = col0 + tl.arange(0, BLOCK_N)
    io_mask = (rows[:, None] < live) & (cols[None, :] < n_out)
    if REDUCE_IN_TILE:
        sum_g, sum_u = _tma_k_range(x_desc, w_desc, row0, col0, n_out, 0, k, k_range, SWIGLU, HAS_SCALE, X_FP8,
                                    WIDEN_INLINE, EXACT_DOT, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, True, SWAP_AB)
        _store_result(out_ptr, scale_ptr, x_scale_ptr, rows, cols, m, n_out, stride_out, sum_g, sum_u, io_mask, SWIGLU,
                      HAS_SCALE, X_FP8)
    else:
        k_lo, k_hi = _k_span(k, k_range, SPLIT_K)
        acc_g, acc_u = _tma_k_range(x_desc, w_desc, row0, col0, n_out, k_lo, k_hi, k_range, SWIGLU, HAS_SCALE, X_FP8,
                                    WIDEN_INLINE, EXACT_DOT, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, False, SWAP_AB)
        _store_tile(out_ptr, ws_ptr, scale_ptr, x_scale_ptr, rows, cols, m, n_out, stride_out, acc_g, acc_u, io_mask,
                    SWIGLU, HAS_SCALE, X_FP8, SPLIT_K)


@triton.jit(do_not_specialize=["m"])
def _split_reduce_kernel(
    ws_ptr, scale_ptr, x_scale_ptr, out_ptr, active_ptr, m, n_out, stride_out,
    HAS_ACTIVE: tl.constexpr, SWIGLU: tl.constexpr, HAS_SCALE: tl.constexpr, X_FP8: tl.constexpr,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):
    """out = sum of the SPLIT_K partials in range order (then SwiGLU), rounded once."""
    wait_for_inputs(PDL)
    live = _live_rows(m, active_ptr, HAS_ACTIVE)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    if tl.program_id(0) * BLOCK_M >= live:
        return
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    io_mask = (rows < live)[:, None] & (cols < n_out)[None, :]
    n_acc = n_out * (2 if SWIGLU else 1)
    g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        base = ws_ptr + (s * m + rows).to(tl.int64)[:, None] * n_acc + cols[None, :]
        g += tl.load(base, mask=io_mask, other=0.0)
        if SWIGLU:
            u += tl.load(base + n_out, mask=io_mask, other=0.0)
    _store_result(out_ptr, scale_ptr, x_scale_ptr, rows, cols, m, n_out, stride_out, g, u, io_mask, SWIGLU, HAS_SCALE,
                  X_FP8)


_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def linear(x, weight, *, out=None, active_rows=None, activation=None, weight_scale=None, x_scale=None):
    """Batch-invariant ``x @ weight.T`` (Triton), same contract as `linear_reference`.

    x [M, K] bf16/fp16/fp32 (row stride free, last dim contiguous), or float8_e4m3fn with
    ``x_scale`` fp32 [M] (W8A8, FP8 weight); weight [N, K] x's dtype, or float8_e4m3fn with
    ``weight_scale`` fp32 [N] (nn.Linear layout; [2F, K] = [gate rows | up rows] for
    ``activation="swiglu"``); out [M, N] (or [M, F]) in x.dtype by default (bf16 for FP8 x) or
    fp32 when given so; active_rows int32 [1] on the device or None. fp32 accumulation, rounded
    once to out.dtype. The tile configuration is `linear_config(N, K, dtype, activation, M)` (M
    only on the GPU: the interpreter keeps the decode tile); row tiles starting at or past the
    active count exit at once and rows past it are not written.
    """
    out, cfg = _checked(x, weight, out, active_rows, activation, weight_scale, x_scale)
    if x.shape[0] == 0 or out.shape[1] == 0:
        return out
    return _launch(x, weight, out, active_rows, activation, cfg, weight_scale, x_scale=x_scale)


def linear_partials(x, weight, *, active_rows=None, weight_scale=None, x_scale=None, out_dtype=None):
    """`linear` (no activation, output in ``out_dtype``, default as `linear`'s) without its split-K
    reduction: a `SplitPartials`
    of the fp32 range sums when the weight's plan splits K and the launch's tile does not add the
    ranges itself (prefill rows on Hopper do), else the finished output [M, N].
    `norms.residual_norm` takes either as its ``sub`` and gives the same bits as from `linear`."""
    out, cfg = _checked(x, weight, None, active_rows, None, weight_scale, x_scale, out_dtype)
    if x.shape[0] == 0 or out.shape[1] == 0:
        return out
    return _launch(x, weight, out, active_rows, None, cfg, weight_scale, reduce=False, x_scale=x_scale)


def _checked(x, weight, out, active_rows, activation, weight_scale, x_scale=None,
             out_dtype=None) -> tuple[torch.Tensor, LinearConfig]:
    """Validate `linear`'s arguments; returns (out, allocated when None, and the launch config)."""
    _check_activation(activation)
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x [M, K] and weight [N, K] expected, got {tuple(x.shape)} and {tuple(weight.shape)}")
    _check_x_scale(x, weight, x_scale)
    if x.dtype not in _KERNEL_DTYPES + (FP8_DTYPE,) or weight.dtype not in (x.dtype, FP8_DTYPE):
        raise ValueError(f"x and weight must share a bf16/fp16/fp32 dtype, or the weight be float8_e4m3fn "
                         f"(got {x.dtype}, {weight.dtype}); fp64 runs on rlt_kernels.reference")
    _check_scale(weight, weight_scale)
    m, k = x.shape
    n = weight.shape[0]
    if activation == "swiglu" and n % 2:
        raise ValueError(f"swiglu needs an even number of weight rows [gate | up], got {n}")
    n_out = n // 2 if activation == "swiglu" else n
    if out is None:
        out = torch.empty((m, n_out), dtype=out_dtype or _default_out_dtype(x), device=x.device)
    if tuple(out.shape) != (m, n_out) or out.dtype not in _KERNEL_DTYPES:
        raise ValueError(f"out must be [{m}, {n_out}] bf16/fp16/fp32, got {tuple(out.shape)} {out.dtype}")
    for name, t in (("x", x), ("weight", weight), ("out", out)):
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension")
    if active_rows is not None and (active_rows.numel() < 1 or active_rows.dtype not in (torch.int32, torch.int64)):
        raise ValueError("active_rows must be an int32 tensor of shape [1]")
    check_launchable(x, weight, out, active_rows, weight_scale, x_scale)
    rows = m if x.is_cuda and not interpreter_active() else None
    weight_dtype = None if weight.dtype == x.dtype else weight.dtype
    smem = SM_SHARED_BYTES if rows is None else shared_memory(_device_index(x))
    return out, linear_config(n, k, x.dtype, activation, rows, weight_dtype, tma=rows is not None and _tma_usable(x, weight),
                              smem=smem)


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def _device_index(t: torch.Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def shared_memory(index: int) -> int:
    """Shared memory a program may use on CUDA device ``index`` (the limit Triton launches against),
    at most SM_SHARED_BYTES, the H100/H200's, within which the tiles were tuned (RTX 4090, L40S and
    other sm_89 GPUs: 99 KiB)."""
    return min(SM_SHARED_BYTES, int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]))


def _tma_usable(x, weight) -> bool:
    """Whether TMA can fetch x's and the weight's tiles: a Hopper or newer GPU, 16-byte aligned
    bases and row strides."""
    if _capability(_device_index(x)) < 9:
        return False
    return all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 and t.shape[1] * t.element_size() >= 16
               for t in (x, weight))


def _launch(x, weight, out, active_rows, activation, cfg: LinearConfig, weight_scale=None, reduce=True, x_scale=None):
    """Launch the kernel on validated arguments with an explicit configuration (`linear` passes
    `linear_config`'s; the perf sweep passes candidates). reduce=False: a split launch returns its
    `SplitPartials` instead of adding them into ``out``."""
    m, k = x.shape
    n_out = out.shape[1]
    swiglu = activation == "swiglu"
    k_range = cfg.k_range(k)
    split = -(-k // k_range) if k else 1  # ranges that hold keys (<= cfg.split_k)
    in_tile = cfg.reduce_in_tile and split > 1
    ws = out
    if split > 1 and not in_tile:
        ws = torch.empty((split, m, n_out * (2 if swiglu else 1)), dtype=torch.float32, device=x.device)
    active = out if active_rows is None else active_rows
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n_out, cfg.block_n), 1 if in_tile else split)
    scale = out if weight_scale is None else weight_scale
    has_scale = weight_scale is not None
    x_fp8 = x_scale is not None
    x_scales = out if x_scale is None else x_scale
    pdl = pdl_launch(out)
    if cfg.tma:
        _linear_tma_kernel[grid](
            TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k]),
            TensorDescriptor.from_tensor(weight, [cfg.block_n, cfg.block_k]), scale, x_scales, out, ws, active, m, n_out,
            k, k_range, out.stride(0), HAS_ACTIVE=active_rows is not None, SWIGLU=swiglu, HAS_SCALE=has_scale,
            X_FP8=x_fp8, WIDEN_INLINE=inline_widening(), EXACT_DOT=exact_dots(), BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, SPLIT_K=split, STAGES=cfg.num_stages,
            REDUCE_IN_TILE=in_tile, SWAP_AB=cfg.swap_ab, PDL=pdl,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl, enable_fp_fusion=True,
        )
    else:
        _linear_kernel[grid](
            x, weight, scale, x_scales, out, ws, active, m, n_out, k, k_range, x.stride(0), weight.stride(0),
            out.stride(0), HAS_ACTIVE=active_rows is not None, SWIGLU=swiglu, HAS_SCALE=has_scale, X_FP8=x_fp8,
            WIDEN_INLINE=inline_widening(),
            EXACT_DOT=exact_dots(),
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            EVEN_K=k % cfg.block_k == 0, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m, SPLIT_K=split, SWAP_AB=cfg.swap_ab, PDL=pdl, num_warps=cfg.num_warps,
            enable_fp_fusion=True,
            num_stages=cfg.num_stages,
            launch_pdl=pdl,
        )
    if in_tile:
        return out
    if split > 1 and not reduce:
        return SplitPartials(ws, weight_scale, out.dtype, x_scale)
    if split > 1:
        reduce_grid = (triton.cdiv(m, REDUCE_BLOCK_M), triton.cdiv(n_out, REDUCE_BLOCK_N))
        _split_reduce_kernel[reduce_grid](
            ws, scale, x_scales, out, active, m, n_out, out.stride(0), HAS_ACTIVE=active_rows is not None, SWIGLU=swiglu,
            HAS_SCALE=has_scale, X_FP8=x_fp8,
            SPLIT_K=split, BLOCK_M=REDUCE_BLOCK_M, BLOCK_N=REDUCE_BLOCK_N, PDL=pdl, num_warps=4,
            enable_fp_fusion=True,
            launch_pdl=pdl,
        )
    return out
