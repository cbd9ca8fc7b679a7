"""Persistent flat-loop linear with K ranges added in the tile (experiment)."""
import torch, triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _flat_in_ranges(x_desc, w_desc, out_ptr, m, n_out, k, k_range, stride_out,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    STAGES: tl.constexpr, PROGRAMS: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(m, BLOCK_M)
    tiles_n = tl.cdiv(n_out, BLOCK_N)
    n_tiles = tiles_m * tiles_n
    k_steps = tl.cdiv(k, BLOCK_K)
    mine = tl.cdiv(n_tiles - pid, PROGRAMS)
    tile = pid - PROGRAMS
    ki = -1
    row0 = 0
    col0 = 0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    per_group = GROUP_M * tiles_n
    for _ in tl.range(0, mine * k_steps, num_stages=STAGES):
        ki = tl.where(ki == k_steps - 1, 0, ki + 1)
        if ki == 0:
            tile += PROGRAMS
            first_m = (tile // per_group) * GROUP_M
            group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
            row0 = (first_m + (tile % per_group) % group_rows) * BLOCK_M
            col0 = ((tile % per_group) // group_rows) * BLOCK_N
        k0 = ki * BLOCK_K
        a = x_desc.load([row0, k0])
        w = w_desc.load([col0, k0])
        acc = tl.dot(a, tl.trans(w), acc)
        if ((k0 + BLOCK_K) % k_range == 0) | (k0 + BLOCK_K >= k):
            total += acc
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if ki == k_steps - 1:
            rows = row0 + tl.arange(0, BLOCK_M)
            cols = col0 + tl.arange(0, BLOCK_N)
            tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :], total.to(out_ptr.dtype.element_ty),
                     mask=(rows[:, None] < m) & (cols[None, :] < n_out))
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

def flat_launch(x, w, out, bm, bn, bk, warps, stages, k_range, programs=132):
    m, k = x.shape
    n = w.shape[0]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    p = min(programs, tiles)
    _flat_in_ranges[(p,)](TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]), out,
                          m, n, k, k_range, out.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, STAGES=stages,
                          PROGRAMS=p, num_warps=warps, num_stages=stages)
    return out

