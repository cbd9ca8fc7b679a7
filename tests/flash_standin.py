"""Pure-torch stand-ins for FlashAttention's paged entry points, for CPU tests of the adapter.

`fa2_module()` provides ``flash_attn.flash_attn_varlen_func`` and `fa3_module()`
``flash_attn_interface.flash_attn_with_kvcache``, with the real signatures, argument checks and
semantics: paged K/V through a block table (page size a multiple of 256 for FA2),
bottom-right causal alignment, GQA by head groups (query head h reads kv head h // (H // KVH)),
default scale 1/sqrt(D), zeros for rows that see no key, GQA single-query transpose constraint
of FA2 (one q row per sequence when max_seqlen_q == 1). Query rows no sequence owns are left
NaN (the real kernels leave them unwritten). Unlike the real kernels they accept fp32/fp64 and
CPU tensors. Dense math, one sequence at a time; nothing here uses rlt's attention code.
"""

from __future__ import annotations

import math
import sys
import types

import torch


def _attend(q, k, v, scale, causal):
    """q [Lq, H, D], k/v [Lk, KVH, D] -> [Lq, H, D]: softmax(q k^T * scale) v per head."""
    lq, h, _ = q.shape
    lk, kvh, _ = k.shape
    cd = torch.float64 if q.dtype == torch.float64 else torch.float32
    k = k.to(cd).repeat_interleave(h // kvh, dim=1)
    v = v.to(cd).repeat_interleave(h // kvh, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.to(cd), k) * scale
    if causal:
        i = torch.arange(lq)[:, None]
        j = torch.arange(lk)[None, :]
        scores = scores.masked_fill(j > i + lk - lq, -math.inf)
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # fully masked rows -> zeros
    return torch.einsum("hqk,khd->qhd", p, v).to(q.dtype)


def _paged_keys(cache, table_row, n):
    """The first n tokens of one sequence from a paged cache [blocks, page, KVH, D]."""
    page = cache.shape[1]
    need = -(-n // page)
    if need > table_row.shape[0]:
        raise RuntimeError(f"sequence of {n} keys needs {need} pages, block table has {table_row.shape[0]}")
    ids = table_row[:need].long()
    if bool(((ids < 0) | (ids >= cache.shape[0])).any()):
        raise RuntimeError(f"block table entries {ids.tolist()} out of range for {cache.shape[0]} pages")
    return cache[ids].reshape(-1, *cache.shape[2:])[:n]


def _check_common(q, k_cache, v_cache, block_table):
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise RuntimeError("query and key/value must have the same dtype")
    if q.shape[-1] % 8 or q.shape[-1] > 256:
        raise RuntimeError("head size must be a multiple of 8 and at most 256")
    if q.shape[-2] % k_cache.shape[-2]:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")
    if block_table is not None and (block_table.dtype != torch.int32 or block_table.stride(-1) != 1):
        raise RuntimeError("block_table must be int32 with a contiguous last dimension")


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """FA2: q [total_q, H, D]; k/v [total_k, KVH, D] or pages [num_blocks, page, KVH, D] with block_table
    [B, max_blocks]; cu_seqlens_q/k int32 [B + 1]. Returns [total_q, H, D]."""
    if dropout_p or window_size != (-1, -1) or softcap or alibi_slopes is not None or return_attn_probs:
        raise NotImplementedError("the stand-in covers inference without dropout, windows, softcap or alibi")
    _check_common(q, k, v, block_table)
    if cu_seqlens_q.dtype != torch.int32 or cu_seqlens_k.dtype != torch.int32:
        raise RuntimeError("cu_seqlens_q and cu_seqlens_k must have dtype int32")
    batch = cu_seqlens_q.numel() - 1
    if batch < 1 or cu_seqlens_k.numel() != batch + 1:
        raise RuntimeError("cu_seqlens_q and cu_seqlens_k must have batch_size + 1 entries, batch_size > 0")
    if block_table is not None:
        if k.shape[1] % 256:
            raise RuntimeError("Paged KV cache block size must be divisible by 256")
        if block_table.shape[0] != batch:
            raise RuntimeError(f"block_table must have {batch} rows, got {block_table.shape[0]}")
    h, kvh = q.shape[1], k.shape[-2]
    if max_seqlen_q == 1 and h > kvh and q.shape[0] != batch:
        raise RuntimeError("single-query GQA reshapes q to [batch_size, ...]: q must have batch_size rows")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    out = torch.full_like(q, float("nan"))
    qs, ks = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(batch):
        lq, lk = qs[b + 1] - qs[b], ks[b + 1] - ks[b]
        if lq > max_seqlen_q or lk > max_seqlen_k:
            raise RuntimeError(f"sequence {b} has {lq} queries / {lk} keys, past max_seqlen_q/k "
                               f"({max_seqlen_q}, {max_seqlen_k})")
        if lq == 0:
            continue
        if block_table is None:
            kb, vb = k[ks[b]: ks[b + 1]], v[ks[b]: ks[b + 1]]
        else:
            kb, vb = _paged_keys(k, block_table[b], lk), _paged_keys(v, block_table[b], lk)
        out[qs[b]: qs[b + 1]] = _attend(q[qs[b]: qs[b + 1]], kb, vb, scale, causal)
    return out


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                            cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                            scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                            return_softmax_lse=False):
    """FA3 (paged, varlen q only): q [total_q, H, D] with cu_seqlens_q int32 [B + 1]; k/v_cache pages
    [num_pages, page, KVH, D]; page_table int32 [B, max_pages]; cache_seqlens int32 [B]."""
    if page_table is None or cu_seqlens_q is None or cache_seqlens is None or max_seqlen_q is None:
        raise NotImplementedError("the stand-in covers the paged varlen-q call (page_table, cu_seqlens_q, "
                                  "max_seqlen_q, cache_seqlens)")
    if any(x is not None for x in (k, v, qv, rotary_cos, cache_batch_idx, cache_leftpad, cu_seqlens_k_new)) \
            or window_size != (-1, -1) or softcap or attention_chunk or return_softmax_lse:
        raise NotImplementedError("the stand-in covers attention over an existing cache only")
    _check_common(q, k_cache, v_cache, page_table)
    batch = cu_seqlens_q.numel() - 1
    if cache_seqlens.dtype != torch.int32 or cache_seqlens.shape != (batch,) or page_table.shape[0] != batch:
        raise RuntimeError(f"cache_seqlens (int32) and page_table must have batch_size={batch} rows")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    out = torch.full_like(q, float("nan"))
    qs, lens = cu_seqlens_q.tolist(), cache_seqlens.tolist()
    for b in range(batch):
        lq = qs[b + 1] - qs[b]
        if lq > max_seqlen_q:
            raise RuntimeError(f"sequence {b} has {lq} queries, past max_seqlen_q ({max_seqlen_q})")
        if lq == 0:
            continue
        kb, vb = _paged_keys(k_cache, page_table[b], lens[b]), _paged_keys(v_cache, page_table[b], lens[b])
        out[qs[b]: qs[b + 1]] = _attend(q[qs[b]: qs[b + 1]], kb, vb, scale, causal)
    return out


def install(monkeypatch, version: str) -> None:
    """Make `rlt_kernels.flash` find the stand-in of "fa2" or "fa3" (and not a real FlashAttention).

    Call `rlt_kernels.flash._flash_module.cache_clear()` after undoing the monkeypatch."""
    from rlt_kernels import flash

    fa2 = types.ModuleType("flash_attn")
    fa2.flash_attn_varlen_func = flash_attn_varlen_func
    fa3 = types.ModuleType("flash_attn_interface")
    fa3.flash_attn_with_kvcache = flash_attn_with_kvcache
    monkeypatch.setitem(sys.modules, "flash_attn", fa2 if version == "fa2" else None)
    monkeypatch.setitem(sys.modules, "flash_attn_interface", fa3 if version == "fa3" else None)
    flash._flash_module.cache_clear()
