"""Masked KV scatter into paged caches, optionally fused with rotary embedding.

Cache layout (one layer): k_cache, v_cache [num_blocks, block_size, kv_heads, head_dim]. The
caches may be strided views (a layer slice of a [L, num_blocks, block_size, kv_heads,
head_dim] pool); only the innermost dimension must be contiguous. A token's slot is
``block * block_size + offset`` (int64). Rows whose slot is negative, or whose row index is
at or past ``active_rows[0]`` (int32 device tensor), write nothing; the kernels test the row
count before they read a row's slot, so padding rows with stale metadata stay inert.

FP8 caches (float8_e4m3fn) take ``k_scale``, ``v_scale`` fp32 [KVH]: a value is stored as
``fp8(clamp(x / scale, ±448))`` rounded to nearest even (`rlt_kernels.fp8.quantize_fp8`), from x
in its own dtype (the rotated k rounded to k's dtype first, as for any cache).

Kernels: one program per (token, group of heads); all address arithmetic is int64. The
scatter is a bit-exact copy when k/v and the cache share a dtype. The fused RoPE kernel
evaluates the rotation with the same fp32 operations as ``norms.apply_rope_reference`` and is
compiled without FMA contraction, so its results equal the reference bit for bit.
"""

from __future__ import annotations

import torch

from ._rows import active_count
from ._pdl import pdl_launch, wait_for_inputs
from ._triton import HAS_TRITON, check_launchable, tl, triton
from .fp8 import FP8_DTYPE, FP8_MAX, check_kv_scales, quantize_fp8
from .norms import apply_rope_reference

FP8_LIMIT = tl.constexpr(FP8_MAX)  # a constexpr object: Triton 3.6 reads no other globals in kernels
TILE_ELEMENTS = 2048  # heads x head_dim elements per program and tensor
NUM_WARPS = 4


def kv_scatter_reference(k, v, k_cache, v_cache, slot_mapping, *, active_rows=None, k_scale=None, v_scale=None):
    """Write k, v [T, KVH, D] to the caches at slot_mapping [T] (int64), quantized with the
    scales [KVH] into FP8 caches. Returns None."""
    _check_scales(k_cache, v_cache, k_scale, v_scale)
    m = active_count(active_rows, k.shape[0])
    if not m:
        return
    slots = slot_mapping[:m].long()
    keep = slots >= 0
    slots = slots[keep]
    bs = k_cache.shape[1]
    blocks, offsets = slots // bs, slots % bs
    if k_scale is None:
        k_cache[blocks, offsets] = k[:m][keep].to(k_cache.dtype)
        v_cache[blocks, offsets] = v[:m][keep].to(v_cache.dtype)
    else:
        k_cache[blocks, offsets] = quantize_fp8(k[:m][keep], k_scale[:, None])
        v_cache[blocks, offsets] = quantize_fp8(v[:m][keep], v_scale[:, None])


def rope_kv_scatter_reference(
    q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, *,
    style="neox", q_bias=None, k_bias=None, q_out=None, active_rows=None, k_scale=None, v_scale=None,
):
    """Rotate q and k (see norms.apply_rope), write rotated k and v into the caches (FP8
    caches: quantized with k_scale / v_scale [KVH]).

    q [T, H, D], k, v [T, KVH, D], positions [T], cos_sin [P, D] fp32, slot_mapping [T] int64.
    Returns the rotated q (q_out when given; may alias q). Rows past the active count are
    neither rotated nor written.
    """
    q_out = apply_rope_reference(q, positions, cos_sin, style=style, bias=q_bias, out=q_out, active_rows=active_rows)
    k_rot = apply_rope_reference(k, positions, cos_sin, style=style, bias=k_bias, active_rows=active_rows)
    kv_scatter_reference(k_rot, v, k_cache, v_cache, slot_mapping, active_rows=active_rows, k_scale=k_scale,
                         v_scale=v_scale)
    return q_out


@triton.jit
def row_limit(active_ptr, num_rows, HAS_ACTIVE: tl.constexpr):
    """Rows below this index are live: ``min(active_rows[0], num_rows)``, or num_rows."""
    if HAS_ACTIVE:
        return tl.minimum(tl.load(active_ptr).to(tl.int32), num_rows)
    else:
        return num_rows


@triton.jit
def slot_offset(slot, block_size, stride_block, stride_slot):
    """int64 element offset of a cache slot (``block * block_size + offset``)."""
    slot = slot.to(tl.int64)
    return (slot // block_size) * stride_block + (slot % block_size) * stride_slot


@triton.jit
def _round_to_e4m3(y):
    """fp32 y (|y| <= 448) rounded to nearest even on the e4m3 grid, still in fp32: the ulp of
    y's binade (2^(e - 3), at least 2^-9 for subnormals) taken from its exponent bits, and the
    rounding done by an fp32 add of 1.5 * 2^23 ulps. The cast to fp8 after it is exact; the
    Triton interpreter's own fp32 -> fp8 cast drops the carry when rounding crosses a binade."""
    a = tl.abs(y)
    exp_bits = (a.to(tl.int32, bitcast=True) >> 23) & 0xFF
    ulp = ((tl.maximum(exp_bits, 127 - 6) - 3) << 23).to(tl.float32, bitcast=True)
    shift = ulp * 12582912.0  # 1.5 * 2^23 ulps: the sum's fp32 ulp is this binade's e4m3 ulp
    r = (a + shift) - shift
    # y's sign bit onto r >= 0 (a negative y that rounds to zero gives -0, as torch's cast does)
    sign = y.to(tl.int32, bitcast=True) & -2147483648
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def to_cache(x, cache_ptr, scale_ptr, heads, num_heads, FP8: tl.constexpr):
    """A [BLOCK_H, BLOCK_D] tile in the cache's dtype: a cast, or with FP8 x / scale[head] in
    fp32, clamped to ±448 and rounded to nearest even."""
    if FP8:
        scale = tl.load(scale_ptr + heads, mask=heads < num_heads, other=1.0)
        y = tl.clamp(tl.math.div_rn(x.to(tl.float32), scale[:, None]), -FP8_LIMIT, FP8_LIMIT)
        return _round_to_e4m3(y).to(cache_ptr.dtype.element_ty)
    return x.to(cache_ptr.dtype.element_ty)


@triton.jit
def _head_mask(heads, dims, num_heads, HEAD_DIM: tl.constexpr):
    """In-bounds mask [BLOCK_H, BLOCK_D] of a (heads, dims) tile."""
    return (heads[:, None] < num_heads) & (dims[None, :] < HEAD_DIM)


@triton.jit(do_not_specialize=["num_rows"])
def _kv_scatter_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, active_ptr, k_scale_ptr, v_scale_ptr,
    num_rows, num_kv_heads, block_size,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, HAS_ACTIVE: tl.constexpr,
    FP8: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    t = tl.program_id(0)
    if t < row_limit(active_ptr, num_rows, HAS_ACTIVE):
        slot = tl.load(slot_ptr + t)
        if slot >= 0:
            heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
            dims = tl.arange(0, BLOCK_D)
            mask = _head_mask(heads, dims, num_kv_heads, HEAD_DIM)
            t64 = t.to(tl.int64)
            h64 = heads.to(tl.int64)[:, None]
            k = tl.load(k_ptr + t64 * stride_kt + h64 * stride_kh + dims[None, :], mask=mask)
            v = tl.load(v_ptr + t64 * stride_vt + h64 * stride_vh + dims[None, :], mask=mask)
            k_dst = k_cache_ptr + slot_offset(slot, block_size, stride_kcb, stride_kcs) + h64 * stride_kch
            v_dst = v_cache_ptr + slot_offset(slot, block_size, stride_vcb, stride_vcs) + h64 * stride_vch
            tl.store(k_dst + dims[None, :], to_cache(k, k_cache_ptr, k_scale_ptr, heads, num_kv_heads, FP8), mask=mask)
            tl.store(v_dst + dims[None, :], to_cache(v, v_cache_ptr, v_scale_ptr, heads, num_kv_heads, FP8), mask=mask)


@triton.jit
def rope_angles(cos_sin_row, dims, HEAD_DIM: tl.constexpr, GPTJ: tl.constexpr):
    """(partner, cos, signed_sin) [BLOCK_D] of one position's row of the cos/sin table: the
    dimension each element rotates with, and the factors of x' = x * cos + partner * signed_sin.
    GPTJ pairs (2i, 2i + 1) share angle i, else (i, i + D/2)."""
    if GPTJ:
        first = (dims % 2) == 0
        partner = dims ^ 1
        freq = dims // 2
    else:
        first = dims < HEAD_DIM // 2
        partner = tl.where(first, dims + HEAD_DIM // 2, dims - HEAD_DIM // 2)
        freq = tl.where(first, dims, dims - HEAD_DIM // 2)
    cos = tl.load(cos_sin_row + freq, mask=dims < HEAD_DIM, other=0)
    sin = tl.load(cos_sin_row + HEAD_DIM // 2 + freq, mask=dims < HEAD_DIM, other=0)
    return partner, cos, tl.where(first, -sin, sin)


@triton.jit
def _mul_rn(a, b):
    """a * b (fp32) rounded to nearest, subnormals kept (`mul.rn.f32`: never contracted into an FMA)."""
    return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _add_rn(a, b):
    """a + b (fp32) rounded to nearest, subnormals kept (`add.rn.f32`)."""
    return tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def rotate_heads(
    x_ptr, bias_ptr, row, heads, num_heads, stride_t, stride_h, stride_bias_h, dims, partner, cos, signed_sin,
    HEAD_DIM: tl.constexpr, HAS_BIAS: tl.constexpr, FP64: tl.constexpr, UNFUSED: tl.constexpr,
):
    """Rotated tile [BLOCK_H, BLOCK_D] of token ``row``: (x + b) * cos + (x' + b') * ±sin.

    x' is the rotation partner of each element; the math runs in fp32 (fp64 when FP64) and
    matches the reference operation for operation: x1*cos - x2*sin == x1*cos + x2*(-sin).
    UNFUSED (fp32 math in kernels compiled with FP fusion on, outside the interpreter): the
    products and their sum as PTX round-to-nearest multiplies and an add (`_mul_rn`, `_add_rn`),
    which no FMA contraction merges and which keep subnormals, so the result is the same as in a
    kernel compiled without fusion. (libdevice's mul_rn/add_rn flush subnormals to zero.)
    """
    if FP64:
        cos = cos.to(tl.float64)
        signed_sin = signed_sin.to(tl.float64)
    mask = _head_mask(heads, dims, num_heads, HEAD_DIM)
    h64 = heads.to(tl.int64)[:, None]
    base = x_ptr + row * stride_t + h64 * stride_h
    x = tl.load(base + dims[None, :], mask=mask, other=0).to(cos.dtype)
    y = tl.load(base + partner[None, :], mask=mask, other=0).to(cos.dtype)
    if HAS_BIAS:
        bias = bias_ptr + h64 * stride_bias_h
        x = x + tl.load(bias + dims[None, :], mask=mask, other=0).to(cos.dtype)
        y = y + tl.load(bias + partner[None, :], mask=mask, other=0).to(cos.dtype)
    if UNFUSED:
        tl.static_assert(not FP64, "rotate_heads: UNFUSED rotations run in fp32")
        return _add_rn(_mul_rn(x, cos[None, :]), _mul_rn(y, signed_sin[None, :]))
    return x * cos[None, :] + y * signed_sin[None, :]


@triton.jit(do_not_specialize=["num_rows"])
def _rope_kv_scatter_kernel(
    q_ptr, q_out_ptr, k_ptr, v_ptr, pos_ptr, cos_sin_ptr, q_bias_ptr, k_bias_ptr,
    k_cache_ptr, v_cache_ptr, slot_ptr, active_ptr, k_scale_ptr, v_scale_ptr,
    num_rows, num_q_heads, num_kv_heads, q_chunks, block_size,
    stride_qt, stride_qh, stride_qot, stride_qoh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cs, stride_qbh, stride_kbh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, GPTJ: tl.constexpr,
    HAS_Q_BIAS: tl.constexpr, HAS_K_BIAS: tl.constexpr, HAS_ACTIVE: tl.constexpr,
    Q_FP64: tl.constexpr, K_FP64: tl.constexpr, FP8: tl.constexpr, PDL: tl.constexpr,
):
    # Programs (t, c) with c < q_chunks rotate a group of q heads; the others rotate a group
    # of k heads, copy the matching v heads and write both into the caches.
    wait_for_inputs(PDL)
    t = tl.program_id(0)
    c = tl.program_id(1)
    if t < row_limit(active_ptr, num_rows, HAS_ACTIVE):
        dims = tl.arange(0, BLOCK_D)
        t64 = t.to(tl.int64)
        partner, cos, signed_sin = rope_angles(cos_sin_ptr + tl.load(pos_ptr + t).to(tl.int64) * stride_cs, dims,
                                               HEAD_DIM, GPTJ)
        if c < q_chunks:
            heads = c * BLOCK_H + tl.arange(0, BLOCK_H)
            q = rotate_heads(
                q_ptr, q_bias_ptr, t64, heads, num_q_heads, stride_qt, stride_qh, stride_qbh, dims, partner,
                cos, signed_sin, HEAD_DIM, HAS_Q_BIAS, Q_FP64, False,
            )
            q = q.to(q_ptr.dtype.element_ty).to(q_out_ptr.dtype.element_ty)
            h64 = heads.to(tl.int64)[:, None]
            mask = _head_mask(heads, dims, num_q_heads, HEAD_DIM)
            tl.store(q_out_ptr + t64 * stride_qot + h64 * stride_qoh + dims[None, :], q, mask=mask)
        else:
            slot = tl.load(slot_ptr + t)
            if slot >= 0:
                heads = (c - q_chunks) * BLOCK_H + tl.arange(0, BLOCK_H)
                k = rotate_heads(
                    k_ptr, k_bias_ptr, t64, heads, num_kv_heads, stride_kt, stride_kh, stride_kbh, dims, partner,
                    cos, signed_sin, HEAD_DIM, HAS_K_BIAS, K_FP64, False,
                )
                k = to_cache(k.to(k_ptr.dtype.element_ty), k_cache_ptr, k_scale_ptr, heads, num_kv_heads, FP8)
                h64 = heads.to(tl.int64)[:, None]
                mask = _head_mask(heads, dims, num_kv_heads, HEAD_DIM)
                v = tl.load(v_ptr + t64 * stride_vt + h64 * stride_vh + dims[None, :], mask=mask)
                k_dst = k_cache_ptr + slot_offset(slot, block_size, stride_kcb, stride_kcs) + h64 * stride_kch
                v_dst = v_cache_ptr + slot_offset(slot, block_size, stride_vcb, stride_vcs) + h64 * stride_vch
                tl.store(k_dst + dims[None, :], k, mask=mask)
                tl.store(v_dst + dims[None, :], to_cache(v, v_cache_ptr, v_scale_ptr, heads, num_kv_heads, FP8),
                         mask=mask)


def head_tile_shape(num_heads: int, head_dim: int) -> tuple[int, int]:
    """(BLOCK_H, BLOCK_D): whole heads, about TILE_ELEMENTS elements per program."""
    block_d = triton.next_power_of_2(head_dim)
    return min(triton.next_power_of_2(num_heads), max(1, TILE_ELEMENTS // block_d)), block_d


def _check_kv(k, v, k_cache, v_cache, slot_mapping, active_rows):
    if k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"k and v must both be [T, KVH, D], got {tuple(k.shape)} and {tuple(v.shape)}")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.dim() != 4 or tuple(cache.shape[2:]) != tuple(k.shape[1:]):
            expected = f"[num_blocks, block_size, {k.shape[1]}, {k.shape[2]}]"
            raise ValueError(f"{name} must be {expected}, got {tuple(cache.shape)}")
    if v_cache.shape[1] != k_cache.shape[1]:
        raise ValueError("k_cache and v_cache must have the same block size")
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping must be [{k.shape[0]}], got {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_mapping must be int64 (or int32), got {slot_mapping.dtype}")
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension (head_dim)")
    if active_rows is not None and active_rows.numel() < 1:
        raise ValueError("active_rows must be an int tensor of shape [1]")


def _check_scales(k_cache, v_cache, k_scale, v_scale) -> None:
    """FP8 caches need fp32 scales [KVH]; caches in another dtype take none."""
    if v_cache.dtype != k_cache.dtype and FP8_DTYPE in (k_cache.dtype, v_cache.dtype):
        raise ValueError(f"k_cache and v_cache must both be float8_e4m3fn or neither, got {k_cache.dtype}, "
                         f"{v_cache.dtype}")
    check_kv_scales(k_cache, k_scale, v_scale)


def kv_scatter(k, v, k_cache, v_cache, slot_mapping, *, active_rows=None, k_scale=None, v_scale=None):
    """Write k, v [T, KVH, D] into k_cache, v_cache [num_blocks, block_size, KVH, D].

    Row i goes to slot ``slot_mapping[i]`` (int64, ``block * block_size + offset``); rows with a
    negative slot or with ``i >= active_rows[0]`` write nothing. Values are cast to the cache
    dtype (a bit-exact copy when the dtypes match), or quantized with k_scale / v_scale fp32
    [KVH] into float8_e4m3fn caches. Live slots must be distinct. One launch, no allocation, no
    host sync (graph-safe). Returns None.
    """
    _check_kv(k, v, k_cache, v_cache, slot_mapping, active_rows)
    _check_scales(k_cache, v_cache, k_scale, v_scale)
    check_launchable(k, v, k_cache, v_cache, slot_mapping, active_rows, k_scale, v_scale)
    num_rows, num_kv_heads, head_dim = k.shape
    if num_rows == 0:
        return
    block_h, block_d = head_tile_shape(num_kv_heads, head_dim)
    grid = (num_rows, triton.cdiv(num_kv_heads, block_h))
    pdl = pdl_launch(k_cache)
    _kv_scatter_kernel[grid](
        k, v, k_cache, v_cache, slot_mapping, slot_mapping if active_rows is None else active_rows,
        k_cache if k_scale is None else k_scale, v_cache if v_scale is None else v_scale,
        num_rows, num_kv_heads, k_cache.shape[1],
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_D=block_d, HAS_ACTIVE=active_rows is not None,
        FP8=k_scale is not None, PDL=pdl, num_warps=NUM_WARPS, launch_pdl=pdl, enable_fp_fusion=True,
    )


def check_rope_inputs(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, *, style, q_bias, k_bias,
                      active_rows, k_scale, v_scale) -> None:
    """ValueError naming the argument where `rope_kv_scatter`'s inputs (shared by
    `attention.rope_paged_attention`) do not fit together."""
    if style not in ("neox", "gptj"):
        raise ValueError(f"style must be 'neox' or 'gptj', got {style!r}")
    _check_kv(k, v, k_cache, v_cache, slot_mapping, active_rows)
    _check_scales(k_cache, v_cache, k_scale, v_scale)
    if q.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q must be [T, H, D] matching k {tuple(k.shape)}, got {tuple(q.shape)}")
    num_rows, num_heads, head_dim = q.shape
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
    if positions.shape != (num_rows,):
        raise ValueError(f"positions must be [{num_rows}], got {tuple(positions.shape)}")
    if cos_sin.dim() != 2 or cos_sin.shape[1] != head_dim or cos_sin.stride(1) != 1:
        raise ValueError(f"cos_sin must be a row-contiguous [P, {head_dim}] table, got {tuple(cos_sin.shape)}")
    for name, bias, heads in (("q_bias", q_bias, num_heads), ("k_bias", k_bias, k.shape[1])):
        if bias is not None and (tuple(bias.shape) != (heads, head_dim) or bias.stride(1) != 1):
            raise ValueError(f"{name} must be a row-contiguous [{heads}, {head_dim}] tensor, got {tuple(bias.shape)}")


def rope_kv_scatter(
    q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, *,
    style="neox", q_bias=None, k_bias=None, q_out=None, active_rows=None, k_scale=None, v_scale=None,
):
    """Rotate q and k, write the rotated k and v into the paged caches: one launch.

    q [T, H, D] and k, v [T, KVH, D] (MHA, GQA or MQA), positions [T] int32/int64, cos_sin
    [P, D] fp32 (``norms.rope_cos_sin``), k_cache, v_cache [num_blocks, block_size, KVH, D],
    slot_mapping [T] int64. style "neox" rotates halves (i, i + D/2), "gptj" interleaved pairs
    (2i, 2i + 1). q_bias [H, D] / k_bias [KVH, D] are added before rotating. Math in fp32
    (fp64 for fp64 inputs), rounded once to the input dtype, then to the cache / q_out dtype.
    The rotated q goes to q_out (allocated when None; may alias q) and is returned. Rows at or
    past ``active_rows[0]`` are neither rotated nor written; rows with a negative slot still get
    q rotated but write no K/V. Graph-safe when q_out is given. float8_e4m3fn caches take
    k_scale / v_scale fp32 [KVH] (see the module docstring).
    """
    check_rope_inputs(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, style=style, q_bias=q_bias,
                      k_bias=k_bias, active_rows=active_rows, k_scale=k_scale, v_scale=v_scale)
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    q_out = torch.empty_like(q) if q_out is None else q_out
    if q_out.shape != q.shape or q.stride(-1) != 1 or q_out.stride(-1) != 1:
        raise ValueError("q_out must have q's shape; q and q_out must be contiguous in head_dim")
    check_launchable(q, q_out, k, v, positions, cos_sin, q_bias, k_bias, k_cache, v_cache, slot_mapping, active_rows,
                     k_scale, v_scale)
    if num_rows == 0:
        return q_out
    block_h, block_d = head_tile_shape(max(num_heads, num_kv_heads), head_dim)
    q_chunks = triton.cdiv(num_heads, block_h)
    grid = (num_rows, q_chunks + triton.cdiv(num_kv_heads, block_h))
    pdl = pdl_launch(k_cache)
    _rope_kv_scatter_kernel[grid](
        q, q_out, k, v, positions, cos_sin,
        q if q_bias is None else q_bias, k if k_bias is None else k_bias,
        k_cache, v_cache, slot_mapping, slot_mapping if active_rows is None else active_rows,
        k_cache if k_scale is None else k_scale, v_cache if v_scale is None else v_scale,
        num_rows, num_heads, num_kv_heads, q_chunks, k_cache.shape[1],
        q.stride(0), q.stride(1), q_out.stride(0), q_out.stride(1),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos_sin.stride(0), 0 if q_bias is None else q_bias.stride(0), 0 if k_bias is None else k_bias.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_D=block_d, GPTJ=style == "gptj",
        HAS_Q_BIAS=q_bias is not None, HAS_K_BIAS=k_bias is not None, HAS_ACTIVE=active_rows is not None,
        Q_FP64=q.dtype == torch.float64, K_FP64=k.dtype == torch.float64, FP8=k_scale is not None,
        PDL=pdl, num_warps=NUM_WARPS, enable_fp_fusion=False, launch_pdl=pdl,
    )
    return q_out
