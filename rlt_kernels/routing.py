"""Routing between persistent per-request slot pools and dense step batches.

* gather_rows: out[i] = src[index[i]] for live rows, zero for padding rows.
* scatter_rows: dst[index[i]] = src[i] for live rows.
* finalize_last_exited: the copy-based LAST_EXITED finalize (reference path for the
  depth-indirection attention): copy an exited token's K/V from its exit plane into every
  deeper plane, for all layers.

A row is live when its index is below ``active_rows[0]`` (int32 device tensor; all rows when
None) and its index entry is non-negative. The kernels test the row count before they read
a row's metadata, so padding rows with stale metadata stay inert.

Row tensors are [N, ...] with contiguous rows (any row stride): 1-D token ids / positions
(int32/int64) and 2-D+ hidden states (bf16/fp16/fp32). Kernels copy tiles of about 2 KiB
(rows x columns); finalize runs one program per (row, layer, group of heads). All address
arithmetic is int64; copies are bit-exact when the dtypes match.
"""

from __future__ import annotations

import math

import torch

from ._rows import active_count
from ._triton import check_launchable, tl, triton
from .kv_cache import NUM_WARPS, head_tile_shape, row_limit

TILE_BYTES = 2048


def gather_rows_reference(src, index, *, out=None, active_rows=None):
    """src [S, ...], index [M] int -> out [M, ...]; padding rows are zero-filled."""
    m_total = index.shape[0]
    out = torch.empty((m_total,) + tuple(src.shape[1:]), dtype=src.dtype, device=src.device) if out is None else out
    m = active_count(active_rows, m_total)
    idx = index[:m].long()
    live = idx >= 0
    rows = src[idx.clamp(min=0)]
    out[:m] = torch.where(live.view(-1, *([1] * (src.dim() - 1))), rows, torch.zeros_like(rows))
    out[m:] = 0
    return out


def scatter_rows_reference(src, index, dst, *, active_rows=None):
    """src [M, ...], index [M] int, dst [S, ...]: dst[index[i]] = src[i] for live rows. Returns dst."""
    m = active_count(active_rows, index.shape[0])
    idx = index[:m].long()
    live = idx >= 0
    dst[idx[live]] = src[:m][live].to(dst.dtype)
    return dst


def finalize_last_exited_reference(
    k_cache, v_cache, block_tables, seq_slots, positions, exit_planes, *, active_rows=None
):
    """Copy exited tokens' K/V into the deeper planes.

    k_cache, v_cache [L, num_blocks, block_size, KVH, D]; block_tables [P, S_rows, max_blocks];
    seq_slots, positions, exit_planes [M] int. For every live row with exit_planes >= 0, the
    token at `positions` of request `seq_slots` is copied, for every layer, from plane
    exit_planes[i] to planes exit_planes[i] + 1 .. P - 1.
    """
    m = active_count(active_rows, seq_slots.shape[0])
    bs = k_cache.shape[2]
    num_planes = block_tables.shape[0]
    for i in range(m):
        e = int(exit_planes[i])
        if e < 0:
            continue
        slot, pos = int(seq_slots[i]), int(positions[i])
        src_block = int(block_tables[e, slot, pos // bs])
        for p in range(e + 1, num_planes):
            dst_block = int(block_tables[p, slot, pos // bs])
            k_cache[:, dst_block, pos % bs] = k_cache[:, src_block, pos % bs]
            v_cache[:, dst_block, pos % bs] = v_cache[:, src_block, pos % bs]


@triton.jit(do_not_specialize=["num_rows"])
def _gather_rows_kernel(
    src_ptr, index_ptr, out_ptr, active_ptr, num_rows, width, stride_src, stride_out,
    BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr, HAS_ACTIVE: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    idx = tl.load(index_ptr + rows, mask=rows < row_limit(active_ptr, num_rows, HAS_ACTIVE), other=-1).to(tl.int64)
    in_row = cols[None, :] < width
    vals = tl.load(src_ptr + idx[:, None] * stride_src + cols[None, :], mask=(idx[:, None] >= 0) & in_row, other=0)
    dst = out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(dst, vals.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < num_rows) & in_row)


@triton.jit(do_not_specialize=["num_rows"])
def _scatter_rows_kernel(
    src_ptr, index_ptr, dst_ptr, active_ptr, num_rows, width, stride_src, stride_dst,
    BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr, HAS_ACTIVE: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    idx = tl.load(index_ptr + rows, mask=rows < row_limit(active_ptr, num_rows, HAS_ACTIVE), other=-1).to(tl.int64)
    mask = (idx[:, None] >= 0) & (cols[None, :] < width)
    vals = tl.load(src_ptr + rows.to(tl.int64)[:, None] * stride_src + cols[None, :], mask=mask)
    tl.store(dst_ptr + idx[:, None] * stride_dst + cols[None, :], vals.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["num_rows"])
def _finalize_kernel(
    k_cache_ptr, v_cache_ptr, tables_ptr, seq_slots_ptr, positions_ptr, exit_planes_ptr, active_ptr,
    num_rows, num_planes, block_size, num_kv_heads,
    stride_tp, stride_ts, stride_tb,
    stride_kl, stride_kb, stride_ks, stride_kh, stride_vl, stride_vb, stride_vs, stride_vh,
    HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, HAS_ACTIVE: tl.constexpr,
):
    i = tl.program_id(0)
    if i < row_limit(active_ptr, num_rows, HAS_ACTIVE):
        exit_plane = tl.load(exit_planes_ptr + i).to(tl.int32)
        if exit_plane >= 0:
            layer = tl.program_id(1).to(tl.int64)
            heads = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
            dims = tl.arange(0, BLOCK_D)
            mask = (heads[:, None] < num_kv_heads) & (dims[None, :] < HEAD_DIM)
            h64 = heads.to(tl.int64)[:, None]
            pos = tl.load(positions_ptr + i).to(tl.int64)
            table = tables_ptr + tl.load(seq_slots_ptr + i).to(tl.int64) * stride_ts + (pos // block_size) * stride_tb
            offset = pos % block_size
            k_tok = k_cache_ptr + layer * stride_kl + offset * stride_ks + h64 * stride_kh + dims[None, :]
            v_tok = v_cache_ptr + layer * stride_vl + offset * stride_vs + h64 * stride_vh + dims[None, :]
            entry = table + exit_plane.to(tl.int64) * stride_tp
            src_block = tl.load(entry).to(tl.int64)
            k = tl.load(k_tok + src_block * stride_kb, mask=mask)
            v = tl.load(v_tok + src_block * stride_vb, mask=mask)
            for _ in range(exit_plane + 1, num_planes):
                entry += stride_tp
                dst_block = tl.load(entry).to(tl.int64)
                tl.store(k_tok + dst_block * stride_kb, k, mask=mask)
                tl.store(v_tok + dst_block * stride_vb, v, mask=mask)


def _row_layout(t: torch.Tensor, name: str) -> tuple[int, int]:
    """(row stride, elements per row) of a [N, ...] tensor whose rows are contiguous."""
    expected = 1
    for size, stride in zip(reversed(t.shape[1:]), reversed(t.stride()[1:])):
        if size != 1 and stride != expected:
            raise ValueError(f"{name} must have contiguous rows (any row stride), got strides {t.stride()}")
        expected *= size
    return t.stride(0), math.prod(t.shape[1:])


def _row_tile(width: int, element_size: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_W): about TILE_BYTES per program, whole short rows per tile."""
    elements = TILE_BYTES // element_size
    block_w = min(triton.next_power_of_2(width), elements)
    return elements // block_w, block_w


def _check_index(index, rows, active_rows):
    if index.dim() != 1 or index.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"index must be a 1-D int32/int64 tensor, got {tuple(index.shape)} {index.dtype}")
    if index.shape[0] != rows:
        raise ValueError(f"index has {index.shape[0]} entries for {rows} rows")
    if active_rows is not None and active_rows.numel() < 1:
        raise ValueError("active_rows must be an int tensor of shape [1]")


def _launch_rows(kernel, src, index, dst, active_rows, rows, width, stride_src, stride_dst):
    block_m, block_w = _row_tile(width, src.element_size())
    grid = (triton.cdiv(rows, block_m), triton.cdiv(width, block_w))
    kernel[grid](
        src, index, dst, index if active_rows is None else active_rows, rows, width, stride_src, stride_dst,
        BLOCK_M=block_m, BLOCK_W=block_w, HAS_ACTIVE=active_rows is not None, num_warps=NUM_WARPS,
        enable_fp_fusion=True,
    )


def gather_rows(src, index, *, out=None, active_rows=None):
    """out[i] = src[index[i]] for live rows; every other row of out is zero-filled.

    src [S, ...] (rows contiguous), index [M] int32/int64, out [M, ...] (allocated with src's
    dtype when None; cast to out's dtype otherwise). Rows at or past ``active_rows[0]`` and
    rows with a negative index are written as zeros. One launch, no host sync (graph-safe when
    out is given). Returns out.
    """
    _check_index(index, index.shape[0], active_rows)
    if out is None:
        out = torch.empty((index.shape[0],) + tuple(src.shape[1:]), dtype=src.dtype, device=src.device)
    if tuple(out.shape) != (index.shape[0],) + tuple(src.shape[1:]):
        raise ValueError(f"out must be {(index.shape[0],) + tuple(src.shape[1:])}, got {tuple(out.shape)}")
    stride_src, width = _row_layout(src, "src")
    stride_out, _ = _row_layout(out, "out")
    check_launchable(src, index, out, active_rows)
    if index.shape[0] and width:
        _launch_rows(_gather_rows_kernel, src, index, out, active_rows, index.shape[0], width, stride_src, stride_out)
    return out


def scatter_rows(src, index, dst, *, active_rows=None):
    """dst[index[i]] = src[i] for live rows (cast to dst's dtype); other rows of dst untouched.

    src [M, ...], index [M] int32/int64, dst [S, ...], rows contiguous in both. Live index
    entries must be distinct. One launch, no allocation, no host sync. Returns dst.
    """
    _check_index(index, src.shape[0], active_rows)
    if tuple(dst.shape[1:]) != tuple(src.shape[1:]):
        raise ValueError(f"dst rows {tuple(dst.shape[1:])} do not match src rows {tuple(src.shape[1:])}")
    stride_src, width = _row_layout(src, "src")
    stride_dst, _ = _row_layout(dst, "dst")
    check_launchable(src, index, dst, active_rows)
    if src.shape[0] and width:
        _launch_rows(_scatter_rows_kernel, src, index, dst, active_rows, src.shape[0], width, stride_src, stride_dst)
    return dst


def finalize_last_exited(k_cache, v_cache, block_tables, seq_slots, positions, exit_planes, *, active_rows=None):
    """Copy exited tokens' K/V from their exit plane into every deeper plane, all layers.

    k_cache, v_cache [L, num_blocks, block_size, KVH, D] (head_dim contiguous); block_tables
    [P, S_rows, max_blocks] int32/int64; seq_slots, positions, exit_planes [M] int. Live rows
    with ``exit_planes[i] >= 0`` copy the token at ``positions[i]`` of table row
    ``seq_slots[i]`` from plane exit_planes[i] to planes exit_planes[i] + 1 .. P - 1; other
    rows read nothing past their exit plane entry. Destination blocks must not be another
    live row's source. One launch, no allocation, no host sync. Returns None.
    """
    if k_cache.dim() != 5 or v_cache.shape != k_cache.shape:
        raise ValueError(f"caches must both be [L, num_blocks, block_size, KVH, D], got {tuple(k_cache.shape)}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("caches must be contiguous in their last dimension (head_dim)")
    if block_tables.dim() != 3:
        raise ValueError(f"block_tables must be [P, S_rows, max_blocks], got {tuple(block_tables.shape)}")
    num_rows = exit_planes.shape[0]
    for name, t in (("seq_slots", seq_slots), ("positions", positions), ("exit_planes", exit_planes)):
        if t.shape != (num_rows,):
            raise ValueError(f"{name} must be [{num_rows}], got {tuple(t.shape)}")
    if active_rows is not None and active_rows.numel() < 1:
        raise ValueError("active_rows must be an int tensor of shape [1]")
    check_launchable(k_cache, v_cache, block_tables, seq_slots, positions, exit_planes, active_rows)
    num_layers, _, block_size, num_kv_heads, head_dim = k_cache.shape
    if num_rows == 0 or num_layers == 0:
        return
    block_h, block_d = head_tile_shape(num_kv_heads, head_dim)
    grid = (num_rows, num_layers, triton.cdiv(num_kv_heads, block_h))
    _finalize_kernel[grid](
        k_cache, v_cache, block_tables, seq_slots, positions, exit_planes,
        exit_planes if active_rows is None else active_rows,
        num_rows, block_tables.shape[0], block_size, num_kv_heads,
        *block_tables.stride(), *k_cache.stride()[:4], *v_cache.stride()[:4],
        HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_D=block_d, HAS_ACTIVE=active_rows is not None,
        num_warps=NUM_WARPS, enable_fp_fusion=True,
    )
