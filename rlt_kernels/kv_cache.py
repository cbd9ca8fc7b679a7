"""Masked KV scatter into paged caches, optionally fused with rotary embedding.

Cache layout (one layer): k_cache, v_cache [num_blocks, block_size, kv_heads, head_dim].
A token's slot is ``block * block_size + offset`` (int64). Rows whose slot is negative, or
whose row index is at or past ``active_rows[0]`` (int32 device tensor), write nothing.
"""

from __future__ import annotations

import torch

from ._rows import active_count
from .norms import apply_rope_reference


def kv_scatter_reference(k, v, k_cache, v_cache, slot_mapping, *, active_rows=None):
    """Write k, v [T, KVH, D] to the caches at slot_mapping [T] (int64). Returns None."""
    m = active_count(active_rows, k.shape[0])
    if not m:
        return
    slots = slot_mapping[:m].long()
    keep = slots >= 0
    slots = slots[keep]
    bs = k_cache.shape[1]
    blocks, offsets = slots // bs, slots % bs
    k_cache[blocks, offsets] = k[:m][keep].to(k_cache.dtype)
    v_cache[blocks, offsets] = v[:m][keep].to(v_cache.dtype)


def rope_kv_scatter_reference(
    q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, *,
    style="neox", q_bias=None, k_bias=None, q_out=None, active_rows=None,
):
    """Rotate q and k (see norms.apply_rope), write rotated k and v into the caches.

    q [T, H, D], k, v [T, KVH, D], positions [T], cos_sin [P, D] fp32, slot_mapping [T] int64.
    Returns the rotated q (q_out when given; may alias q). Rows past the active count are
    neither rotated nor written.
    """
    q_out = apply_rope_reference(q, positions, cos_sin, style=style, bias=q_bias, out=q_out, active_rows=active_rows)
    k_rot = apply_rope_reference(k, positions, cos_sin, style=style, bias=k_bias, active_rows=active_rows)
    kv_scatter_reference(k_rot, v, k_cache, v_cache, slot_mapping, active_rows=active_rows)
    return q_out
