"""Routing between persistent per-request slot pools and dense step batches.

* gather_rows: out[i] = src[index[i]] for live rows, zero for padding rows.
* scatter_rows: dst[index[i]] = src[i] for live rows.
* finalize_last_exited: the copy-based LAST_EXITED finalize (reference path for the
  depth-indirection attention): copy an exited token's K/V from its exit plane into every
  deeper plane, for all layers.

A row is live when its index is below ``active_rows[0]`` (int32 device tensor; all rows when
None) and its index entry is non-negative.
"""

from __future__ import annotations

import torch

from ._rows import active_count


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
