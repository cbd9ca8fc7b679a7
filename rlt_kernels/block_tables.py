"""Cache slots of a pass's tokens in every plane, from the paged block tables, in one launch.

block_tables int32 [P, S, max_blocks] (plane, request slot, block index; -1: no block),
token_slots int32 [M] (each token's request slot), positions int64 [M], block size B:

    out[p, i] = block_tables[p, token_slots[i], positions[i] // B] * B + positions[i] % B

int64 [P, M], or -1 where that block is not allocated (negative entry), where the position lies
past the table, and for rows at or past ``active_rows[0]`` (int32 device tensor; all rows when
None), whose metadata is never read. The slot is what `kv_cache` and `attention` write at.
"""

from __future__ import annotations

import torch

from ._rows import active_count
from ._triton import check_launchable, tl, triton
from .kv_cache import row_limit

BLOCK_ROWS = 128


def cache_slots_reference(block_tables, token_slots, positions, block_size: int, *, out=None, active_rows=None):
    """Torch reference of `cache_slots`."""
    planes, _, width = block_tables.shape
    out = torch.empty((planes, positions.shape[0]), dtype=torch.int64, device=positions.device) if out is None else out
    out.fill_(-1)
    m = active_count(active_rows, positions.shape[0])
    pos = positions[:m].long()
    index = pos // block_size
    inside = index < width
    blocks = block_tables[:, token_slots[:m].long(), index.clamp(max=width - 1)].long()
    out[:, :m] = torch.where((blocks >= 0) & inside, blocks * block_size + pos % block_size, -1)
    return out


@triton.jit(do_not_specialize=["num_rows"])
def _cache_slots_kernel(
    tables_ptr, token_slots_ptr, positions_ptr, out_ptr, active_ptr, num_rows, width, block_size,
    stride_tp, stride_ts, stride_op, HAS_ACTIVE: tl.constexpr, BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    plane = tl.program_id(1).to(tl.int64)
    live = rows < row_limit(active_ptr, num_rows, HAS_ACTIVE)
    pos = tl.load(positions_ptr + rows, mask=live, other=0).to(tl.int64)
    slot = tl.load(token_slots_ptr + rows, mask=live, other=0).to(tl.int64)
    index = pos // block_size
    inside = live & (index < width)
    block = tl.load(tables_ptr + plane * stride_tp + slot * stride_ts + index, mask=inside, other=-1).to(tl.int64)
    result = tl.where(block >= 0, block * block_size + pos % block_size, -1)
    tl.store(out_ptr + plane * stride_op + rows, result, mask=rows < num_rows)


def cache_slots(block_tables, token_slots, positions, block_size: int, *, out=None, active_rows=None):
    """int64 [P, M] cache slot of each of M tokens in each of P planes (see the module
    docstring), in ``out`` when given (int64 [P, M], last dimension contiguous). block_tables
    int32 [P, S, max_blocks] with a contiguous last dimension, token_slots int32/int64 [M],
    positions int64/int32 [M], active_rows int32 [1] or None. One launch, no host sync (graph-safe)."""
    if block_tables.dim() != 3 or block_tables.stride(2) != 1:
        raise ValueError(f"block_tables must be [planes, slots, max_blocks] with a contiguous last dimension, "
                         f"got {tuple(block_tables.shape)}")
    if token_slots.shape != positions.shape or positions.dim() != 1:
        raise ValueError(f"token_slots and positions must be [M], got {tuple(token_slots.shape)} and "
                         f"{tuple(positions.shape)}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    planes, _, width = block_tables.shape
    num_rows = positions.shape[0]
    if out is None:
        out = torch.empty((planes, num_rows), dtype=torch.int64, device=positions.device)
    if tuple(out.shape) != (planes, num_rows) or out.dtype != torch.int64 or (num_rows > 1 and out.stride(1) != 1):
        raise ValueError(f"out must be int64 [{planes}, {num_rows}] with contiguous rows, got {out.dtype} "
                         f"{tuple(out.shape)}")
    check_launchable(block_tables, token_slots, positions, out, active_rows)
    if num_rows == 0 or planes == 0:
        return out
    _cache_slots_kernel[(triton.cdiv(num_rows, BLOCK_ROWS), planes)](
        block_tables, token_slots, positions, out, positions if active_rows is None else active_rows, num_rows, width,
        block_size, block_tables.stride(0), block_tables.stride(1), out.stride(0),
        HAS_ACTIVE=active_rows is not None, BLOCK=BLOCK_ROWS, num_warps=4, enable_fp_fusion=True,  # integer arithmetic only
    )
    return out
