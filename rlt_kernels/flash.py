"""Optional FlashAttention backend with the `rlt_kernels.attention.paged_attention` interface.

Install one of:

* FlashAttention 2: ``pip install -e .[flash]`` (the ``flash-attn`` wheel; CUDA, Ampere or newer).
* FlashAttention 3 (Hopper): build ``hopper/`` of the flash-attention repository
  (``cd hopper && python setup.py install``); it provides the ``flash_attn_interface`` module.

`flash_version()` says which one imports ("fa3" is preferred, then "fa2"; None for neither).

What maps onto FlashAttention's paged API: every call whose keys all come from one block-table
plane per sequence. The plane of sequence s is ``plane_offset + query_depth[s] % plane_modulus``
(0 without depth options), its table row is ``block_tables[plane, seq_slots[s]]``; the adapter
gathers these rows into a plain [S, max_blocks] table and makes one depth-free call:

* FA2: ``flash_attn_varlen_func(q, k_cache, v_cache, query_start_loc, cu_seqlens_k, max_seqlen_q,
  max_seqlen_k, causal=True, block_table=...)`` for every pass (decode, chunked prefill,
  verification). FA2's ``flash_attn_with_kvcache`` takes queries as [batch, seqlen_q] and the
  interface does not say statically that a call has one query per sequence, so decode uses the
  varlen call too; ``max_seqlen_q`` is at least 2 so FA2 never takes its single-query GQA
  transpose (that path needs exactly one q row per sequence). FA2's paged kernels need
  ``block_size`` to be a multiple of 256 (a ValueError names it otherwise).
* FA3: ``flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=..., page_table=...,
  cu_seqlens_q=query_start_loc, max_seqlen_q=T, causal=True)``; any block size.

``key_depth`` (per-key plane indirection) has no FlashAttention equivalent and raises ValueError:
LAST_EXITED runs with copy-based reads (``last_exited_reads="copy"``) on this backend.
``active_seqs`` is honoured on the device: sequences at or past it get no keys (``seq_len`` 0,
table rows of slot 0) and their rows, like rows no sequence owns, keep out's values (zeros when
out is None). ``workspace`` and ``split_size`` are accepted and ignored. Causal alignment is
bottom-right, GQA maps query head h to kv head ``h // (H // KVH)``, default scale 1/sqrt(D), and
``seq_len == 0`` rows give zeros, all as in the Triton kernel. Dtypes and devices are
FlashAttention's (bf16/fp16 on CUDA); results agree with the Triton kernel to rounding, and the
kernels FlashAttention picks may depend on the batch shape (no batch-invariance guarantee). The
call allocates the result and small metadata.
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


def flash_version():
    """"fa3" or "fa2" for the FlashAttention module that imports (FA3 preferred), else None."""
    found = _flash_module()
    return None if found is None else found[0]


def flash_available() -> bool:
    """True when FlashAttention 3 or 2 imports."""
    return _flash_module() is not None


def block_size_problem(block_size: int):
    """Why the installed FlashAttention cannot page a cache with this block size, or None."""
    if flash_version() == "fa2" and block_size % 256:
        return f"FlashAttention 2's paged kernels need block_size to be a multiple of 256, got {block_size}"
    return None


def read_tables(block_tables, n_seqs, *, seq_slots=None, query_depth=None, plane_offset=0, plane_modulus=None,
                live=None):
    """The block-table row each sequence reads: int32 [S, max_blocks].

    block_tables int32 [S_rows, max_blocks] or [P, S_rows, max_blocks]; query_depth None, an int
    or int32 [S]; live bool [S] or None (dead sequences read slot 0's row).
    """
    tables = block_tables if block_tables.dim() == 3 else block_tables.unsqueeze(0)
    num_planes = tables.shape[0]
    modulus = (num_planes - plane_offset) if plane_modulus is None else int(plane_modulus)
    if plane_offset < 0 or modulus < 1 or plane_offset + modulus > num_planes:
        raise ValueError(f"planes plane_offset..plane_offset+plane_modulus-1 ({plane_offset}, "
                         f"{modulus}) must lie within the {num_planes} block-table planes")
    dev = tables.device
    slots = torch.arange(n_seqs, device=dev) if seq_slots is None else seq_slots[:n_seqs].long()
    if live is not None:
        slots = torch.where(live, slots, torch.zeros_like(slots))
    if isinstance(query_depth, torch.Tensor):
        planes = plane_offset + torch.remainder(query_depth[:n_seqs].long(), modulus)
    else:
        depth = 0 if query_depth is None else int(query_depth)
        planes = torch.full((n_seqs,), plane_offset + depth % modulus, dtype=torch.long, device=dev)
    return tables[planes, slots].contiguous()


def paged_attention(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *,
    scale=None, out=None, workspace=None, seq_slots=None, query_depth=None, key_depth=None,
    plane_offset=0, plane_modulus=None, active_seqs=None, split_size=None, decode_from=None,
):
    """`rlt_kernels.attention.paged_attention` through FlashAttention (see the module docstring).

    q [T, H, D]; k/v_cache [num_blocks, block_size, KVH, D]; block_tables int32 [S_rows, max_blocks]
    or [P, S_rows, max_blocks]; seq_lens int32 [S]; query_start_loc int32 [S + 1]; active_seqs int32
    [1] or None. Returns out [T, H, D].
    """
    del workspace, split_size, decode_from  # one arithmetic for every row
    if key_depth is not None:
        raise ValueError("the FlashAttention backend cannot read planes through key_depth (per-key plane "
                         "indirection); run LAST_EXITED with copy-based reads or use rlt_kernels.attention")
    found = _flash_module()
    if found is None:
        raise RuntimeError("FlashAttention is not available: install the flash-attn package "
                           "(pip install -e .[flash]) or FlashAttention 3 (flash_attn_interface)")
    kind, fa = found
    t_total, _, d = q.shape
    block_size = k_cache.shape[1]
    problem = block_size_problem(block_size)
    if problem:
        raise ValueError(problem)
    n_seqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != n_seqs + 1:
        raise ValueError(f"query_start_loc must have {n_seqs + 1} entries, got {query_start_loc.shape[0]}")
    live = None
    key_lens = seq_lens
    if active_seqs is not None:
        live = torch.arange(n_seqs, device=q.device) < active_seqs[:1]
        key_lens = torch.where(live, seq_lens, torch.zeros_like(seq_lens))
    tables = read_tables(block_tables, n_seqs, seq_slots=seq_slots, query_depth=query_depth,
                         plane_offset=plane_offset, plane_modulus=plane_modulus, live=live)
    if out is None:
        out = torch.zeros_like(q)
    if t_total == 0 or n_seqs == 0:
        return out
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if kind == "fa3":
        res = fa.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=key_lens, page_table=tables, cu_seqlens_q=query_start_loc,
            max_seqlen_q=t_total, softmax_scale=scale, causal=True,
        )
    else:
        cu_seqlens_k = torch.zeros(n_seqs + 1, dtype=torch.int32, device=q.device)
        cu_seqlens_k[1:] = torch.cumsum(key_lens, 0)
        res = fa.flash_attn_varlen_func(
            q, k_cache, v_cache, query_start_loc, cu_seqlens_k, max(t_total, 2), tables.shape[1] * block_size,
            softmax_scale=scale, causal=True, block_table=tables,
        )
    n_live = torch.full((1,), n_seqs, dtype=torch.long, device=q.device)
    if active_seqs is not None:
        n_live = active_seqs[:1].long().clamp(0, n_seqs)
    tokens = torch.arange(t_total, device=q.device)
    owned = (tokens >= query_start_loc[0]) & (tokens < query_start_loc.index_select(0, n_live))
    out.copy_(torch.where(owned[:, None, None], res.to(out.dtype), out))
    return out
