"""Optional FlashAttention backend with the `rlt_kernels.attention.paged_attention` interface.

Install one of:

* FlashAttention 2: ``pip install -e .[flash]`` (the ``flash-attn`` wheel; CUDA, Ampere or newer).
* FlashAttention 3 (Hopper): build ``hopper/`` of the flash-attention repository
  (``cd hopper && python setup.py install``); it provides the ``flash_attn_interface`` module.

`flash_available()` says whether either imports on a machine with CUDA. FA3 is preferred.

Supported: the plain mode -- bf16/fp16 q and caches, block tables [S_rows, max_blocks] (or a
single plane [1, S_rows, max_blocks]), ``seq_slots``, ``scale``, ``out``; causal with bottom-right
alignment, GQA/MQA, ``seq_len == 0`` rows give zeros, rows no sequence owns keep out's values.
The loop-depth options (``query_depth``, ``key_depth``, ``plane_offset``, ``plane_modulus``,
several planes) and ``active_seqs`` raise ValueError naming the option: use the Triton kernel.
``workspace`` and ``split_size`` are accepted and ignored (FlashAttention manages its own).

Differences from the Triton kernel: results agree to rounding, not bit for bit. FA3 runs with
``num_splits=1`` so a row's result does not depend on the batch; FA2's varlen path picks its
own key splits for single-query GQA batches and needs block_size to be a multiple of 256. The
call allocates (the result and small metadata), so it is not allocation-free under CUDA graphs.
"""

from __future__ import annotations

import functools
import math

import torch


@functools.lru_cache(maxsize=None)
def _flash_module():
    """("fa3", flash_attn_interface), ("fa2", flash_attn) or None when neither imports."""
    try:
        import flash_attn_interface

        return "fa3", flash_attn_interface
    except ImportError:
        pass
    try:
        import flash_attn

        return "fa2", flash_attn
    except ImportError:
        return None


def flash_available() -> bool:
    """True when CUDA is present and FlashAttention 3 or 2 imports."""
    return torch.cuda.is_available() and _flash_module() is not None


def paged_attention(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *,
    scale=None, out=None, workspace=None, seq_slots=None, query_depth=None, key_depth=None,
    plane_offset=0, plane_modulus=None, active_seqs=None, split_size=None,
):
    """`rlt_kernels.attention.paged_attention` through FlashAttention (plain mode only).

    q [T, H, D] bf16/fp16; k/v_cache [num_blocks, block_size, KVH, D]; block_tables int32
    [S_rows, max_blocks] or [1, S_rows, max_blocks]; seq_lens int32 [S]; query_start_loc int32
    [S + 1]. Returns out [T, H, D].
    """
    del workspace, split_size
    unsupported = [name for name, used in (
        ("query_depth", query_depth is not None),
        ("key_depth", key_depth is not None),
        ("plane_offset", plane_offset != 0),
        ("plane_modulus", plane_modulus is not None),
        ("active_seqs", active_seqs is not None),
        ("block_tables with several planes", block_tables.dim() == 3 and block_tables.shape[0] != 1),
    ) if used]
    if unsupported:
        raise ValueError(f"the FlashAttention backend does not support {', '.join(unsupported)}; "
                         "use rlt_kernels.attention.paged_attention")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"the FlashAttention backend needs bf16 or fp16 inputs, got {q.dtype}")
    backend = _flash_module()
    if backend is None or not q.is_cuda:
        raise RuntimeError("FlashAttention is not available: it needs CUDA tensors and the flash-attn "
                           "package (pip install -e .[flash]) or FlashAttention 3 (flash_attn_interface)")
    kind, fa = backend
    tables = block_tables[0] if block_tables.dim() == 3 else block_tables
    n_seqs = seq_lens.shape[0]
    tables = tables.index_select(0, seq_slots[:n_seqs].long()) if seq_slots is not None else tables[:n_seqs]
    tables = tables.contiguous()
    t_total, _, d = q.shape
    block_size = k_cache.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if kind == "fa3":
        res = fa.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=seq_lens, page_table=tables, cu_seqlens_q=query_start_loc,
            max_seqlen_q=t_total, softmax_scale=scale, causal=True, num_splits=1,
        )
    else:
        if block_size % 256:
            raise ValueError(f"FlashAttention 2 needs block_size to be a multiple of 256, got {block_size}")
        cu_seqlens_k = torch.zeros(n_seqs + 1, dtype=torch.int32, device=q.device)
        cu_seqlens_k[1:] = torch.cumsum(seq_lens, 0)
        res = fa.flash_attn_varlen_func(
            q, k_cache, v_cache, query_start_loc, cu_seqlens_k, t_total, tables.shape[1] * block_size,
            softmax_scale=scale, causal=True, block_table=tables,
        )
    if out is None:
        return res
    tokens = torch.arange(t_total, device=q.device)
    owned = (tokens >= query_start_loc[0]) & (tokens < query_start_loc[n_seqs])
    out.copy_(torch.where(owned[:, None, None], res.to(out.dtype), out))
    return out
