"""Paged attention with loop-depth indirection.

One kernel family serves decode, chunked prefill, packed varlen prefill and speculative
verification (several query tokens per sequence). The baseline signature follows the
FlashAttention / vLLM convention; keyword options add loop-depth awareness.

Layouts
    q            [T, H, D]            query tokens of all sequences, packed
    k/v_cache    [num_blocks, block_size, KVH, D]   one layer's paged cache
    block_tables [S_rows, max_blocks] int32, or [P, S_rows, max_blocks] with one table per plane
    seq_lens     [S] int32            keys visible to each sequence (context incl. its queries)
    query_start_loc [S + 1] int32     sequence s owns query tokens [qsl[s], qsl[s+1])

Causality is bottom-right aligned: query i of a sequence with q_len queries sits at position
``seq_len - q_len + i`` and sees keys 0..position. A sequence with ``seq_len == 0`` is inert:
its query rows are written as zeros. Sequences at or past ``active_seqs[0]`` (int32 device
tensor) are skipped entirely and their rows are left untouched, as are rows no sequence owns.

Loop-depth indirection (LAST_EXITED without copies)
    ``query_depth`` is the loop index (0-based) the queries run at: an int or int32 [S].
    ``key_depth`` [num_blocks, block_size] (int8/int32) holds, per key token, the last loop
    index that token ran; it is looked up through plane 0's block table. A key is read from
    plane ``plane_offset + (min(query_depth, key_depth) % plane_modulus)``; without
    ``key_depth`` every key is read at the query's own depth. SHARED is ``plane_modulus=1``;
    Huginn's core layers use ``plane_offset=1`` and ``plane_modulus`` = number of core planes
    (compress-sN is a smaller modulus).

``seq_slots`` [S] int32 maps each sequence to its row of block_tables (persistent per-request
tables); default: sequence s uses row s.

Numerics: fp32 scores and softmax, keys visited in tiles of 64 from position 0 upward with an
online softmax, so a query's result is identical however many queries share its program.
Long contexts are split into fixed-size key ranges (``split_size``, never derived from the
batch) merged in a fixed order, so splitting never changes a result.
"""

from __future__ import annotations

import math

import torch

from ._rows import active_count, compute_dtype

KEY_TILE = 64


def _plane_index(qd, kd, plane_offset, plane_modulus):
    d = torch.minimum(qd, kd) if kd is not None else qd
    return plane_offset + torch.remainder(d, plane_modulus)


def paged_attention_reference(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *,
    scale=None, out=None, workspace=None, seq_slots=None, query_depth=None, key_depth=None,
    plane_offset=0, plane_modulus=None, active_seqs=None, split_size=None,
):
    """Torch reference of `paged_attention` (same arguments; `workspace`/`split_size` unused)."""
    del workspace, split_size
    t_total, h, d = q.shape
    _, bs, kvh, _ = k_cache.shape
    if h % kvh:
        raise ValueError(f"query heads ({h}) must be a multiple of kv heads ({kvh})")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.empty_like(q) if out is None else out
    tables = block_tables if block_tables.dim() == 3 else block_tables.unsqueeze(0)
    num_planes = tables.shape[0]
    modulus = (num_planes - plane_offset) if plane_modulus is None else plane_modulus
    dev = q.device
    n_seqs = seq_lens.shape[0]
    n_active = active_count(active_seqs, n_seqs)
    if n_active == 0:
        return out
    seq_lens_l = seq_lens[:n_active].long()
    qsl = query_start_loc[: n_active + 1].long()
    q_lens = qsl[1:] - qsl[:-1]
    if bool((q_lens > seq_lens_l).any() & (seq_lens_l > 0).any()):
        bad = ((q_lens > seq_lens_l) & (seq_lens_l > 0)).nonzero()
        if bad.numel():
            raise ValueError("query_start_loc gives a sequence more queries than its seq_len")
    slots = (torch.arange(n_seqs, device=dev) if seq_slots is None else seq_slots.long())[:n_active]
    if query_depth is None:
        qdepth = torch.zeros(n_active, dtype=torch.long, device=dev)
    elif isinstance(query_depth, int):
        qdepth = torch.full((n_active,), query_depth, dtype=torch.long, device=dev)
    else:
        qdepth = query_depth[:n_active].long()

    # Per query token: owning sequence and causal limit.
    tok_seq = torch.repeat_interleave(torch.arange(n_active, device=dev), q_lens)
    tok_idx = torch.arange(int(qsl[-1] - qsl[0]), device=dev) + qsl[0]
    local = tok_idx - qsl[tok_seq]
    limit = seq_lens_l[tok_seq] - q_lens[tok_seq] + local + 1  # keys visible to the token
    live = seq_lens_l[tok_seq] > 0
    n_tok = tok_idx.numel()
    cd = compute_dtype(q.dtype)
    qf = q[tok_idx].to(cd) * scale  # [n, H, D]
    m_i = torch.full((n_tok, h), -math.inf, dtype=cd, device=dev)
    l_i = torch.zeros((n_tok, h), dtype=cd, device=dev)
    acc = torch.zeros((n_tok, h, d), dtype=cd, device=dev)
    group = h // kvh
    max_limit = int(limit[live].max()) if bool(live.any()) else 0
    for start in range(0, max_limit, KEY_TILE):
        pos = start + torch.arange(KEY_TILE, device=dev)  # [64]
        valid = (pos[None, :] < limit[:, None]) & live[:, None]  # [n, 64]
        logical = torch.clamp(pos // bs, max=tables.shape[2] - 1)
        slot_rows = slots[tok_seq]  # [n]
        qd = qdepth[tok_seq][:, None].expand(-1, KEY_TILE)
        kd = None
        if key_depth is not None:
            b0 = tables[0][slot_rows[:, None], logical[None, :]].long()
            kd = key_depth[b0.clamp(min=0), (pos % bs)[None, :]].long()
        plane = _plane_index(qd, kd, plane_offset, modulus)
        plane = torch.where(valid, plane, torch.zeros_like(plane))
        blocks = tables[plane, slot_rows[:, None], logical[None, :]].long()
        blocks = torch.where(valid, blocks, torch.zeros_like(blocks)).clamp(min=0)
        offs = (pos % bs)[None, :].expand_as(blocks)
        kt = k_cache[blocks, offs].to(cd)  # [n, 64, KVH, D]
        vt = v_cache[blocks, offs].to(cd)
        kt = torch.where(valid[..., None, None], kt, torch.zeros_like(kt))
        vt = torch.where(valid[..., None, None], vt, torch.zeros_like(vt))
        kt = kt.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)  # [n, H, 64, D]
        vt = vt.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)
        s = (qf[:, :, None, :] * kt).sum(-1)  # [n, H, 64]
        s = torch.where(valid[:, None, :], s, torch.full_like(s, -math.inf))
        m_new = torch.maximum(m_i, s.amax(-1))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m_i - m_safe)
        p = torch.exp(s - m_safe[..., None])
        l_i = l_i * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + (p[..., None] * vt).sum(-2)
        m_i = m_new
    res = acc / torch.where(l_i > 0, l_i, torch.ones_like(l_i))[..., None]
    res = torch.where(live[:, None, None], res, torch.zeros_like(res))
    out[tok_idx] = res.to(out.dtype)
    return out
