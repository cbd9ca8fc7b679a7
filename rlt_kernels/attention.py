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

FP8 caches: k/v_cache float8_e4m3fn with ``k_scale``, ``v_scale`` fp32 [KVH] (stored value
times its KV head's scale is the key / value; `rlt_kernels.fp8`). K and V tiles are widened
exactly to q's dtype, K's scale multiplies the score scale and V's the output, so the key order
and the tiles, and with them the batch invariance, are those of a cache in q's dtype. The decode
kernel reads an aligned FP8 cache as int32 words and widens them in registers (same values).

``seq_slots`` [S] int32 maps each sequence to its row of block_tables (persistent per-request
tables); default: sequence s uses row s.

Two arithmetics, picked per query row by position: rows at or past ``decode_from`` (None: no
row; an int; or int32 [S], the sequence's first generated position) are *generated tokens* and
run the decode kernel, the others the tile kernel. ``decode_from=0`` is a decode launch (only
the decode kernel runs). Each arithmetic gives a row the same bits however many rows share the
launch, whatever their kinds; the two give slightly different bits for the same row, so a
runtime keeps each token on one of them (rlt: prompt tokens on the tile kernel, generated tokens
on the decode kernel, in decode, verification and recomputation alike).

Numerics: fp32 scores and softmax, keys visited from position 0 upward with an online softmax:
in 64-key tiles by the tile kernel, in tiles of ``DECODE_LANE_ELEMENTS / GP`` keys whose lanes keep
separate softmax states (folded at the end of each key range) by the decode kernel, which over an
FP8 cache applies its tiles in pairs (one rescale of a lane's state for two keys). Long contexts
are split into fixed-size key ranges (``split_size``, never derived from the batch) merged in a
fixed order, so splitting never changes a result.

The Triton kernels (`paged_attention`)
    Inputs bf16/fp16/fp32 (q, caches and out share a contiguous last dimension; other strides
    are free; k_cache and v_cache share one layout), head_dim up to 256 (non powers of two,
    e.g. Huginn's 96, are padded with masks), any block size (16..256 typical; a 64-key tile
    may span several pages), int64 address arithmetic. ``query_depth`` values must be >= 0.
    A tile-kernel program owns one KV head and a tile of ``BLOCK_M`` rows: ``BLOCK_M // GP`` consecutive
    queries of one sequence times the ``GP`` (group size rounded up to a power of two) query
    heads that share the KV head. The tile shape depends only on the group size and head_dim,
    so verify and prefill rows run the same instructions. The decode kernel's program owns one
    query token and one KV head (its GP query heads) and runs without tensor cores. Every key range of
    ``split_size`` keys starts a fresh (max, sum, acc) state, and the ranges are merged in
    order 0, 1, 2, ...; with few programs (small decode batches at long context) the ranges
    run in parallel programs that write fp32 partials to ``workspace`` and a combine kernel
    merges them in the same order with the same arithmetic (a tile whose keys fit one range
    writes its output directly), so the output bits are the same whether or not the launch
    splits. A split decode launch runs a few range programs per row (`_decode_range_programs`),
    each taking every n-th range, so block tables as wide as a long context limit do not launch
    a program per range. Given ``range_counters`` (`new_range_counters`), a split decode launch needs no
    combine kernel: the last range program of each row to finish merges the row itself. Size the workspace with `attention_workspace_size`;
    with ``out`` and a large enough ``workspace`` given the call allocates nothing (CUDA graph
    safe). Without a workspace the call allocates one when it decides to split. Results
    depend on ``split_size``: keep it fixed for a deployment (default `DEFAULT_SPLIT_SIZE`).
    The kernel cannot raise on device data: a live sequence with more queries than
    ``seq_len`` (an error for the reference) gets zeros for the rows that see no key.
"""

from __future__ import annotations

import functools
import math

import torch

from ._dot import exact_dots, mma
from ._rows import active_count, compute_dtype
from ._pdl import pdl_launch, wait_for_inputs
from ._triton import check_launchable, interpreter_active, tl, triton
from ._widen import inline_widening, widen_fp8, widen_fp8_words
from .fp8 import FP8_DTYPE, check_kv_scales
from .kv_cache import (check_rope_inputs, rope_angles, rope_kv_scatter, rope_kv_scatter_reference, rotate_heads,
                       slot_offset, to_cache)

KEY_TILE = 64
DEFAULT_SPLIT_SIZE = 1024


def _plane_index(qd, kd, plane_offset, plane_modulus):
    d = torch.minimum(qd, kd) if kd is not None else qd
    return plane_offset + torch.remainder(d, plane_modulus)


def paged_attention_reference(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *,
    scale=None, out=None, workspace=None, seq_slots=None, query_depth=None, key_depth=None,
    plane_offset=0, plane_modulus=None, active_seqs=None, split_size=None, decode_from=None,
    k_scale=None, v_scale=None, range_counters=None,
):
    """Torch reference of `paged_attention` (same arguments; `workspace`, `split_size`,
    `decode_from` and `range_counters` choose arithmetic or launches, not results, and are
    unused). FP8 caches: scores are q . k_stored * k_scale, outputs softmax @ v_stored * v_scale."""
    del workspace, split_size, decode_from, range_counters
    t_total, h, d = q.shape
    _, bs, kvh, _ = k_cache.shape
    if h % kvh:
        raise ValueError(f"query heads ({h}) must be a multiple of kv heads ({kvh})")
    _check_kv_scales(k_cache, v_cache, k_scale, v_scale)
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
    tok_idx = torch.arange(int(qsl[0]), int(qsl[-1]), device=dev)
    tok_seq = torch.searchsorted(qsl[1:], tok_idx, right=True)
    local = tok_idx - qsl[tok_seq]
    limit = seq_lens_l[tok_seq] - q_lens[tok_seq] + local + 1  # keys visible to the token
    live = seq_lens_l[tok_seq] > 0
    n_tok = tok_idx.numel()
    cd = compute_dtype(q.dtype)
    group = h // kvh
    qf = (q[tok_idx].to(cd) * scale).view(n_tok, kvh, group, d)
    m_i = torch.full((n_tok, kvh, group), -math.inf, dtype=cd, device=dev)
    l_i = torch.zeros((n_tok, kvh, group), dtype=cd, device=dev)
    acc = torch.zeros((n_tok, kvh, group, d), dtype=cd, device=dev)
    max_limit = int(limit[live].max()) if bool(live.any()) else 0
    seq_tables = tables[:, slots]  # [P, S, max_blocks]
    for start in range(0, max_limit, KEY_TILE):
        pos = start + torch.arange(KEY_TILE, device=dev)  # [64]
        logical = torch.clamp(pos // bs, max=tables.shape[2] - 1)
        offs = pos % bs
        kd = None
        if key_depth is not None:
            b0 = seq_tables[0][:, logical].long().clamp(min=0)  # [S, 64]
            kd = key_depth[b0, offs[None, :]].long()
        plane = _plane_index(qdepth[:, None], kd, plane_offset, modulus).expand(-1, KEY_TILE)
        blocks = seq_tables[plane, torch.arange(n_active, device=dev)[:, None], logical[None, :]].long().clamp(min=0)
        kt = k_cache[blocks, offs[None, :]].to(cd).index_select(0, tok_seq)  # [n, 64, KVH, D]
        vt = v_cache[blocks, offs[None, :]].to(cd).index_select(0, tok_seq)
        valid = (pos[None, :] < limit[:, None]) & live[:, None]  # [n, 64]
        kt = torch.where(valid[..., None, None], kt, torch.zeros_like(kt)).permute(0, 2, 1, 3)  # [n, KVH, 64, D]
        vt = torch.where(valid[..., None, None], vt, torch.zeros_like(vt)).permute(0, 2, 1, 3)
        s = (qf[:, :, :, None, :] * kt[:, :, None]).sum(-1)  # [n, KVH, G, 64]
        if k_scale is not None:
            s = s * k_scale.to(cd)[None, :, None, None]
        s = torch.where(valid[:, None, None, :], s, torch.full_like(s, -math.inf))
        m_new = torch.maximum(m_i, s.amax(-1))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m_i - m_safe)
        p = torch.exp(s - m_safe[..., None])
        l_i = l_i * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + (p[..., None] * vt[:, :, None]).sum(-2)
        m_i = m_new
    acc, l_i = acc.reshape(n_tok, h, d), l_i.reshape(n_tok, h)
    res = acc / torch.where(l_i > 0, l_i, torch.ones_like(l_i))[..., None]
    if v_scale is not None:
        res = res * v_scale.to(cd).repeat_interleave(group)[None, :, None]
    res = torch.where(live[:, None, None], res, torch.zeros_like(res))
    out[tok_idx] = res.to(out.dtype)
    return out


# ---------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------

_LOG2E = 1.4426950408889634
_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32)


@triton.jit
def _locate_tile(qsl_ptr, active_ptr, seq_lens_ptr, n_seqs, QPT: tl.constexpr, HAS_ACTIVE: tl.constexpr):
    """Map program_id(0) to its sequence and query tile.

    Sequence s owns program ids ``qsl[s] // QPT + s`` up to ``qsl[s+1] // QPT + s``: room for
    its ceil(q_len / QPT) tiles, so ``T // QPT + S`` programs cover any batch without the host
    reading the metadata. Returns (seq, q_begin, q_len, first local query, seq_len, idle).
    """
    pid = tl.program_id(0)
    n_active = n_seqs + pid * 0
    if HAS_ACTIVE:
        n_active = tl.minimum(tl.load(active_ptr), n_seqs)
    lo = pid * 0
    hi = tl.maximum(n_active, 1)
    while hi - lo > 1:  # largest s < n_active whose first program id is <= pid
        mid = (lo + hi) // 2
        ahead = tl.load(qsl_ptr + mid) // QPT + mid > pid
        lo = tl.where(ahead, lo, mid)
        hi = tl.where(ahead, mid, hi)
    seq = lo
    q_begin = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_begin
    first = (pid - (q_begin // QPT + seq)) * QPT
    seq_len = tl.load(seq_lens_ptr + seq)
    idle = (n_active <= 0) | (first < 0) | (first >= q_len)
    return seq, q_begin, q_len, first, seq_len, idle


@triton.jit
def _merge(m_run, l_run, acc_run, m_part, l_part, acc_part):
    """Fold a key range's softmax state into the running one; rows whose range saw no key keep
    theirs. The side with the larger max keeps weight exactly 1, so every update is a single
    multiply-add whose rounding does not depend on the compiler's FMA contraction choices."""
    take = m_part > float("-inf")
    run_larger = m_run >= m_part
    m_max = tl.maximum(m_run, m_part)
    w = tl.exp2(tl.minimum(m_run, m_part) - tl.where(take, m_max, 0.0))  # weight of the smaller
    l_new = tl.where(run_larger, l_run + l_part * w, l_run * w + l_part)
    acc_new = tl.where(run_larger[:, None], acc_run + acc_part * w[:, None], acc_run * w[:, None] + acc_part)
    return (tl.where(take, m_max, m_run), tl.where(take, l_new, l_run),
            tl.where(take[:, None], acc_new, acc_run))


@triton.jit
def _dim_mask(ok, offs_d, HEAD_DIM: tl.constexpr, DP: tl.constexpr):
    """Mask of [rows, DP] tiles: rows where `ok`, lanes below HEAD_DIM (DP pads it to a power of 2)."""
    mask = ok[:, None]
    if HEAD_DIM != DP:
        mask = mask & (offs_d[None, :] < HEAD_DIM)
    return mask


@triton.jit
def _store_output(out_ptr, token, head, stride_ot, stride_oh, offs_d, io_mask, l_run, acc_run, v_scale_ptr, kvh,
                  KV_FP8: tl.constexpr):
    """out = acc / l (zero for rows that saw no key), times the KV head's V scale with an FP8
    cache, rounded to out's dtype."""
    o = acc_run / tl.where(l_run > 0, l_run, 1.0)[:, None]
    if KV_FP8:
        o = o * tl.load(v_scale_ptr + kvh)
    ptrs = out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(ptrs, o.to(out_ptr.dtype.element_ty), mask=io_mask)


@triton.jit
def _tile_rows(kvh, first, q_begin, q_len, seq_len, dfrom, GP: tl.constexpr, GROUP: tl.constexpr, QPT: tl.constexpr,
               BLOCK_M: tl.constexpr):
    """The BLOCK_M (query, head) rows of one (query tile, KV head) program: row index, query index
    within the sequence, validity (rows at or past position ``dfrom`` belong to the decode
    kernel), query head, token index, keys each row sees, and the tile's last visible key + 1."""
    rows = tl.arange(0, BLOCK_M)
    local = first + rows // GP
    row_ok = (local < q_len) & (rows % GP < GROUP) & (tl.maximum(seq_len - q_len + local, 0) < dfrom)
    head = kvh * GROUP + rows % GP
    token = (q_begin + local).to(tl.int64)
    limit = tl.where(row_ok, seq_len - q_len + local + 1, 0)
    kv_end = tl.maximum(seq_len - q_len + tl.minimum(q_len, first + QPT), 0)
    return rows, local, row_ok, head, token, limit, kv_end


@triton.jit
def _tile_keys(own_plane_table, table, key_depth_ptr, start, range_end, offs_n, BLOCK_SIZE: tl.constexpr,
               stride_tb, stride_kdb, stride_kdo, HAS_KEY_DEPTH: tl.constexpr):
    """Block ids of key tile ``start`` in the query's own plane (clamped to >= 0: a plane a key
    never reached is not read from) and, with a key-depth table, each key's last loop (looked
    up through plane 0). Keys at or past range_end get block 0 and depth 0."""
    pos = start + offs_n
    key_ok = pos < range_end
    logical = pos // BLOCK_SIZE
    blk_own = tl.maximum(tl.load(own_plane_table + logical * stride_tb, mask=key_ok, other=0), 0).to(tl.int64)
    if HAS_KEY_DEPTH:
        blk0 = tl.maximum(tl.load(table + logical * stride_tb, mask=key_ok, other=0), 0).to(tl.int64)
        kd = tl.load(key_depth_ptr + blk0 * stride_kdb + (pos % BLOCK_SIZE) * stride_kdo, mask=key_ok, other=0)
        kd = kd.to(tl.int32)
    else:
        kd = tl.zeros_like(pos)
    return blk_own, kd


@triton.jit
def _sequence_planes(seq, kvh, tables_ptr, slots_ptr, qdepth_ptr, k_ptr, v_ptr, qdepth_value, plane_offset,
                     plane_modulus, stride_ts, stride_tp, stride_ch, HAS_SLOTS: tl.constexpr,
                     QDEPTH_TENSOR: tl.constexpr):
    """Sequence `seq`'s block tables (plane 0), its query loop, the table of the plane that loop
    reads, and KV head `kvh`'s K and V bases."""
    if HAS_SLOTS:
        slot = tl.load(slots_ptr + seq)
    else:
        slot = seq
    table = tables_ptr + slot.to(tl.int64) * stride_ts
    if QDEPTH_TENSOR:
        qd = tl.load(qdepth_ptr + seq)
    else:
        qd = qdepth_value + seq * 0
    own_plane_table = table + (plane_offset + qd % plane_modulus).to(tl.int64) * stride_tp
    return table, qd, own_plane_table, k_ptr + kvh.to(tl.int64) * stride_ch, v_ptr + kvh.to(tl.int64) * stride_ch


@triton.jit(do_not_specialize=["partial"])
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, ws_ptr,
    tables_ptr, seq_lens_ptr, qsl_ptr, slots_ptr, qdepth_ptr, key_depth_ptr, active_ptr, decode_from_ptr,
    k_scale_ptr, v_scale_ptr, qk_scale, n_seqs, n_heads, qdepth_value, decode_from_value, plane_offset, plane_modulus,
    split_size, n_splits_max, ml_base, partial,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_co, stride_ch,
    stride_tp, stride_ts, stride_tb, stride_kdb, stride_kdo,
    GROUP: tl.constexpr, GP: tl.constexpr, QPT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DP: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HAS_ACTIVE: tl.constexpr, HAS_SLOTS: tl.constexpr, QDEPTH_TENSOR: tl.constexpr,
    HAS_KEY_DEPTH: tl.constexpr, DECODE_FROM_TENSOR: tl.constexpr, KV_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr,
    EXACT_DOT: tl.constexpr, PDL: tl.constexpr, KV_ALIGNED: tl.constexpr, WIDEN_INLINE: tl.constexpr,
):
    """One program: KV head program_id(1), a tile of BLOCK_M (query, head) rows, and either
    every key range (partial == 0: writes out) or range program_id(2) only (partial != 0:
    writes the range's fp32 state to the workspace for `_combine_kernel`)."""
    wait_for_inputs(PDL)
    seq, q_begin, q_len, first, seq_len, idle = _locate_tile(
        qsl_ptr, active_ptr, seq_lens_ptr, n_seqs, QPT, HAS_ACTIVE)
    if idle:
        return
    kvh = tl.program_id(1)
    dfrom = _decode_from(decode_from_ptr, seq, decode_from_value, DECODE_FROM_TENSOR)
    rows, local, row_ok, head, token, limit, kv_end = _tile_rows(kvh, first, q_begin, q_len, seq_len, dfrom, GP, GROUP,
                                                                 QPT, BLOCK_M)
    n_ranges = (kv_end + split_size - 1) // split_size
    c_lo = tl.program_id(2)  # 0 when not splitting (grid dimension 2 is 1)
    c_hi = tl.where(partial != 0, tl.minimum(c_lo + 1, n_ranges), n_ranges)
    if (partial != 0) & (c_lo >= n_ranges):
        return

    offs_d = tl.arange(0, DP)
    offs_n = tl.arange(0, BLOCK_N)
    io_mask = _dim_mask(row_ok, offs_d, HEAD_DIM, DP)
    q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=io_mask, other=0.0)

    table, qd, own_plane_table, k_head, v_head = _sequence_planes(
        seq, kvh, tables_ptr, slots_ptr, qdepth_ptr, k_ptr, v_ptr, qdepth_value, plane_offset, plane_modulus,
        stride_ts, stride_tp, stride_ch, HAS_SLOTS, QDEPTH_TENSOR)
    if KV_FP8:  # FP8 K/V are widened exactly; K's scale joins the score scale, V's the output's
        qk_scale = qk_scale * tl.load(k_scale_ptr + kvh)

    m_run = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_run = tl.zeros([BLOCK_M], tl.float32)
    acc_run = tl.zeros([BLOCK_M, DP], tl.float32)
    for c in range(c_lo, c_hi):
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, DP], tl.float32)
        range_end = tl.minimum((c + 1) * split_size, kv_end)
        # Block ids and key depths are fetched one key tile ahead, so a tile's K/V loads never
        # wait on the block table.
        blk_own, kd = _tile_keys(own_plane_table, table, key_depth_ptr, c * split_size, range_end, offs_n,
                                 BLOCK_SIZE, stride_tb, stride_kdb, stride_kdo, HAS_KEY_DEPTH)
        for start in range(c * split_size, range_end, BLOCK_N):
            pos = start + offs_n
            key_ok = pos < range_end
            within = pos % BLOCK_SIZE
            kv_mask = _dim_mask(key_ok, offs_d, HEAD_DIM, DP)
            # Keys that ran at least the query's loop live in the query's own plane; a key that
            # exited earlier is read from the plane of its last loop.
            kv_row = blk_own * stride_cb + within.to(tl.int64) * stride_co
            if HAS_KEY_DEPTH:
                early = key_ok & (kd < qd)
                plane = plane_offset + kd % plane_modulus
                blk = tl.load(table + plane.to(tl.int64) * stride_tp + (pos // BLOCK_SIZE) * stride_tb,
                              mask=early, other=0)
                kv_row = tl.where(early, blk.to(tl.int64) * stride_cb + within.to(tl.int64) * stride_co, kv_row)
            if KV_ALIGNED:  # 16-byte loads (and copies into the pipeline's buffers); a dot's bits never depend on them
                kv_row = tl.multiple_of(kv_row, 16)
            k = tl.load(k_head + kv_row[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_head + kv_row[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
            if KV_FP8:
                k = widen_fp8(k, q, WIDEN_INLINE)  # exact; integer instructions for bf16 q on the GPU
                v = widen_fp8(v, q, WIDEN_INLINE)
            blk_own, kd = _tile_keys(own_plane_table, table, key_depth_ptr, start + BLOCK_N, range_end, offs_n,
                                     BLOCK_SIZE, stride_tb, stride_kdb, stride_kdo, HAS_KEY_DEPTH)

            s = mma(q, tl.trans(k), None, DOT_PRECISION, EXACT_DOT) * qk_scale
            s = tl.where(pos[None, :] < limit[:, None], s, float("-inf"))
            # A row without a visible key in this tile keeps its state bit for bit: its
            # rescale factor is exactly 1 and its weights exactly 0 (no -inf - -inf NaN).
            m_tile = tl.max(s, 1)
            seen = m_tile > float("-inf")
            m_i_new = tl.maximum(m_i, m_tile)
            m_ref = tl.where(seen, m_i_new, 0.0)
            alpha = tl.where(seen, tl.exp2(m_i - m_ref), 1.0)
            p = tl.exp2(s - m_ref[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = mma(p.to(v.dtype), v, acc * alpha[:, None], DOT_PRECISION, EXACT_DOT)
            m_i = m_i_new
        m_run, l_run, acc_run = _merge(m_run, l_run, acc_run, m_i, l_i, acc)

    if (partial != 0) & (n_ranges > 1):
        idx = (token * n_heads + head) * n_splits_max + c_lo
        has = row_ok & (c_lo * split_size < limit)
        ws_mask = _dim_mask(has, offs_d, HEAD_DIM, DP)
        tl.store(ws_ptr + idx[:, None] * HEAD_DIM + offs_d[None, :], acc_run, mask=ws_mask)
        tl.store(ws_ptr + ml_base + 2 * idx, m_run, mask=has)
        tl.store(ws_ptr + ml_base + 2 * idx + 1, l_run, mask=has)
    else:  # unsplit, or a split launch whose tile has one key range: its merged state is final
        _store_output(out_ptr, token, head, stride_ot, stride_oh, offs_d, io_mask, l_run, acc_run, v_scale_ptr, kvh,
                      KV_FP8)


@triton.jit
def _combine_kernel(
    out_ptr, ws_ptr, seq_lens_ptr, qsl_ptr, active_ptr, decode_from_ptr, v_scale_ptr,
    n_seqs, n_heads, decode_from_value, split_size, n_splits_max, ml_base, stride_ot, stride_oh,
    GROUP: tl.constexpr, GP: tl.constexpr, QPT: tl.constexpr, BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr, DP: tl.constexpr, HAS_ACTIVE: tl.constexpr, DECODE_FROM_TENSOR: tl.constexpr,
    KV_FP8: tl.constexpr, PDL: tl.constexpr,
):
    """Merge the key-range partials of one (query tile, KV head) in order 0, 1, 2, ... with
    `_merge` (the very arithmetic the unsplit kernel uses) and write the output rows. Tiles
    whose keys fit one range were written by their range program."""
    wait_for_inputs(PDL)
    seq, q_begin, q_len, first, seq_len, idle = _locate_tile(
        qsl_ptr, active_ptr, seq_lens_ptr, n_seqs, QPT, HAS_ACTIVE)
    if idle:
        return
    kvh = tl.program_id(1)
    dfrom = _decode_from(decode_from_ptr, seq, decode_from_value, DECODE_FROM_TENSOR)
    rows, local, row_ok, head, token, limit, kv_end = _tile_rows(kvh, first, q_begin, q_len, seq_len, dfrom, GP, GROUP,
                                                                 QPT, BLOCK_M)
    n_ranges = (kv_end + split_size - 1) // split_size
    if n_ranges == 1:
        return  # the range program wrote these rows itself
    offs_d = tl.arange(0, DP)
    io_mask = _dim_mask(row_ok, offs_d, HEAD_DIM, DP)

    m_run = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_run = tl.zeros([BLOCK_M], tl.float32)
    acc_run = tl.zeros([BLOCK_M, DP], tl.float32)
    base = (token * n_heads + head) * n_splits_max
    for c in range(0, n_ranges):
        has = row_ok & (c * split_size < limit)
        idx = base + c
        m_part = tl.load(ws_ptr + ml_base + 2 * idx, mask=has, other=float("-inf"))
        l_part = tl.load(ws_ptr + ml_base + 2 * idx + 1, mask=has, other=0.0)
        ws_mask = _dim_mask(has, offs_d, HEAD_DIM, DP)
        acc_part = tl.load(ws_ptr + idx[:, None] * HEAD_DIM + offs_d[None, :], mask=ws_mask, other=0.0)
        m_run, l_run, acc_run = _merge(m_run, l_run, acc_run, m_part, l_part, acc_part)
    _store_output(out_ptr, token, head, stride_ot, stride_oh, offs_d, io_mask, l_run, acc_run, v_scale_ptr, kvh, KV_FP8)


@triton.jit
def _locate_row(token, qsl_ptr, active_ptr, seq_lens_ptr, n_seqs, HAS_ACTIVE: tl.constexpr):
    """Map query token ``token`` (a program id) to its sequence. Returns (seq, token, position, idle):
    idle for a token no live sequence owns. Sequence t owning exactly token t (decode) is
    recognised without the binary search, and without waiting for the live count: its loads go out
    beside the count's."""
    seq = tl.minimum(token, tl.maximum(n_seqs - 1, 0))
    n_active = n_seqs + token * 0
    if HAS_ACTIVE:
        n_active = tl.minimum(tl.load(active_ptr), n_seqs)
    if (seq >= n_active) | (tl.load(qsl_ptr + seq) != token) | (tl.load(qsl_ptr + seq + 1) != token + 1):
        lo = token * 0
        hi = tl.maximum(n_active, 1)
        while hi - lo > 1:  # largest s < n_active with qsl[s] <= token
            mid = (lo + hi) // 2
            ahead = tl.load(qsl_ptr + mid) > token
            lo = tl.where(ahead, lo, mid)
            hi = tl.where(ahead, mid, hi)
        seq = lo
    q_begin = tl.load(qsl_ptr + seq)
    q_end = tl.load(qsl_ptr + seq + 1)
    seq_len = tl.load(seq_lens_ptr + seq)
    idle = (n_active <= 0) | (token < q_begin) | (token >= q_end)
    position = seq_len - (q_end - q_begin) + (token - q_begin)
    return seq, token.to(tl.int64), position, idle


@triton.jit
def _decode_from(decode_from_ptr, seq, decode_from_value, DECODE_FROM_TENSOR: tl.constexpr):
    """First position of sequence `seq` whose query rows take the decode arithmetic."""
    if DECODE_FROM_TENSOR:
        return tl.load(decode_from_ptr + seq)
    return decode_from_value + seq * 0


@triton.jit
def _decode_tile_keys(own_plane_table, table, key_depth_ptr, start, range_end, offs_n, BLOCK_N: tl.constexpr,
                      BLOCK_SIZE: tl.constexpr, stride_tb, stride_kdb, stride_kdo, HAS_KEY_DEPTH: tl.constexpr):
    """`_tile_keys` for a decode key tile. Where a tile never straddles two blocks (BLOCK_N divides
    BLOCK_SIZE; ranges and tiles start at multiples of BLOCK_N) its block id is one scalar, read
    once (0 for a tile at or past range_end); key depths stay per key."""
    if BLOCK_SIZE % BLOCK_N == 0:
        logical = start.to(tl.uint32) // BLOCK_SIZE  # (start >= 0: unsigned, a shift for a power of two)
        ok = start < range_end
        blk_own = tl.maximum(tl.load(own_plane_table + logical * stride_tb, mask=ok, other=0), 0).to(tl.int64)
        if HAS_KEY_DEPTH:
            blk0 = tl.maximum(tl.load(table + logical * stride_tb, mask=ok, other=0), 0).to(tl.int64)
            within = (start.to(tl.uint32) % BLOCK_SIZE).to(tl.int32) + offs_n
            kd = tl.load(key_depth_ptr + blk0 * stride_kdb + within * stride_kdo, mask=(start + offs_n) < range_end,
                         other=0).to(tl.int32)
        else:
            kd = tl.zeros_like(offs_n)
    else:
        blk_own, kd = _tile_keys(own_plane_table, table, key_depth_ptr, start, range_end, offs_n, BLOCK_SIZE, stride_tb,
                                 stride_kdb, stride_kdo, HAS_KEY_DEPTH)
    return blk_own, kd


@triton.jit
def _decode_kv_tile(k_head, v_head, table, blk_own, kd, qd, start, range_end, offs_n, offs_d, plane_offset,
                    plane_modulus, stride_cb, stride_co, stride_tp, stride_tb, BLOCK_N: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, DP: tl.constexpr, HAS_KEY_DEPTH: tl.constexpr,
                    KV_ALIGNED: tl.constexpr):
    """K and V of key tile ``start`` as [1, BLOCK_N, DP] (keys at or past range_end give zeros; over
    an FP8 cache read as words their K rows are read from the tile's block unmasked, and their
    scores are never applied), loaded straight into the decode kernel's 3-D layout. ``blk_own``/``kd``
    come from `_decode_tile_keys` for the same tile."""
    pos = start + offs_n
    key_ok = pos < range_end
    if (BLOCK_SIZE % BLOCK_N == 0) and not HAS_KEY_DEPTH:
        # One block per tile: a scalar base and per-thread row offsets that stay for the whole loop.
        base = blk_own * stride_cb + (start.to(tl.uint32) % BLOCK_SIZE).to(tl.int64) * stride_co
        kv_row = offs_n * stride_co
    else:
        within = (pos % BLOCK_SIZE).to(tl.int64)
        kv_row = blk_own * stride_cb + within * stride_co
        if HAS_KEY_DEPTH:  # keys that exited before the query's loop live in their last loop's plane
            early = key_ok & (kd < qd)
            plane = plane_offset + kd % plane_modulus
            blk = tl.load(table + plane.to(tl.int64) * stride_tp + (pos // BLOCK_SIZE) * stride_tb, mask=early,
                          other=0)
            kv_row = tl.where(early, blk.to(tl.int64) * stride_cb + within * stride_co, kv_row)
        base = tl.zeros([], tl.int64)
    if KV_ALIGNED:  # every key row starts 16 elements aligned: 16-byte loads along the head dimension
        base = tl.multiple_of(base, 16)
        kv_row = tl.multiple_of(kv_row, 16)
    if k_head.dtype.element_ty == tl.float8e4nv and KV_ALIGNED and HEAD_DIM % 4 == 0:
        # FP8 key rows as int32 words (whole words, 16-byte aligned), widened by `_lane_update`
        offs_w = tl.arange(0, DP // 4)
        offs = tl.multiple_of(kv_row >> 2, 4)[None, :, None] + offs_w[None, None, :]
        k_words = k_head.to(tl.pointer_type(tl.int32), bitcast=True) + (base >> 2)
        v_words = v_head.to(tl.pointer_type(tl.int32), bitcast=True) + (base >> 2)
        mask = key_ok[None, :, None]
        if HEAD_DIM != DP:
            dims = offs_w[None, None, :] < HEAD_DIM // 4
            k = tl.load(k_words + offs, mask=dims, other=0)
            mask = mask & dims
        else:
            k = tl.load(k_words + offs)
        v = tl.load(v_words + offs, mask=mask, other=0)
    else:
        offs = kv_row[None, :, None] + offs_d[None, None, :]
        mask = key_ok[None, :, None]
        if HEAD_DIM != DP:
            mask = mask & (offs_d[None, None, :] < HEAD_DIM)
        k = tl.load(k_head + base + offs, mask=mask, other=0.0)
        v = tl.load(v_head + base + offs, mask=mask, other=0.0)
    return k, v


@triton.jit
def _widened(t, WIDEN_INLINE: tl.constexpr):
    """A K or V tile of `_decode_kv_tile` in fp32 (exact): FP8 words through `widen_fp8_words`."""
    if t.dtype == tl.int32:
        wide = widen_fp8_words(t, WIDEN_INLINE)
    else:
        wide = t.to(tl.float32)
    return wide


@triton.jit
def _lane_scores(q, k, start, range_end, offs_n, WIDEN_INLINE: tl.constexpr):
    """Scores [GP, BLOCK_N] fp32 of key tile ``start``, lane n taking key start + n; -inf for keys at
    or past range_end (whatever their K rows held)."""
    s = tl.sum(q * _widened(k, WIDEN_INLINE), 2)
    return tl.where(((start + offs_n) < range_end)[None, :], s, float("-inf"))


@triton.jit
def _lane_update(q, k, v, start, range_end, offs_n, m_i, l_i, acc, WIDEN_INLINE: tl.constexpr):
    """One key tile into the per-lane online softmax: lane n takes key start + n. q [GP, 1, DP]
    (scaled), k/v [1, BLOCK_N, DP] (or FP8 words [1, BLOCK_N, DP / 4]); state m_i/l_i [GP, BLOCK_N],
    acc [GP, BLOCK_N, DP] fp32."""
    s = _lane_scores(q, k, start, range_end, offs_n, WIDEN_INLINE)
    # Lanes without a key keep their state bit for bit (factor exactly 1, weight exactly 0).
    m_new = tl.maximum(m_i, s)
    seen = m_new > float("-inf")
    m_ref = tl.where(seen, m_new, 0.0)
    alpha = tl.where(seen, tl.exp2(m_i - m_ref), 1.0)
    p = tl.exp2(s - m_ref)
    l_i = l_i * alpha + p
    acc = acc * alpha[:, :, None] + p[:, :, None] * _widened(v, WIDEN_INLINE)
    return m_new, l_i, acc


@triton.jit
def _lane_update_pair(q, k_a, v_a, k_b, v_b, start, range_end, offs_n, m_i, l_i, acc, BLOCK_N: tl.constexpr,
                      WIDEN_INLINE: tl.constexpr):
    """Key tiles ``start`` and ``start + BLOCK_N`` into the per-lane online softmax at once: one new
    maximum and one rescale of a lane's state for its two keys, then both keys' weights (tile a's
    first). Arguments as `_lane_update`; a tile past range_end adds weight 0."""
    s_a = _lane_scores(q, k_a, start, range_end, offs_n, WIDEN_INLINE)
    s_b = _lane_scores(q, k_b, start + BLOCK_N, range_end, offs_n, WIDEN_INLINE)
    m_new = tl.maximum(m_i, tl.maximum(s_a, s_b))
    seen = m_new > float("-inf")
    m_ref = tl.where(seen, m_new, 0.0)
    alpha = tl.where(seen, tl.exp2(m_i - m_ref), 1.0)
    p_a = tl.exp2(s_a - m_ref)
    p_b = tl.exp2(s_b - m_ref)
    l_i = l_i * alpha + p_a + p_b
    acc = acc * alpha[:, :, None] + p_a[:, :, None] * _widened(v_a, WIDEN_INLINE)
    acc = acc + p_b[:, :, None] * _widened(v_b, WIDEN_INLINE)
    return m_new, l_i, acc


@triton.jit
def _slot_fetch(k_head, v_head, table, own_plane_table, key_depth_ptr, blk, kd, qd, start, lap, range_end, offs_n,
                offs_d, plane_offset, plane_modulus, stride_cb, stride_co, stride_tp, stride_tb, stride_kdb, stride_kdo,
                BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, DP: tl.constexpr,
                HAS_KEY_DEPTH: tl.constexpr, KV_ALIGNED: tl.constexpr):
    """One prefetch slot of `_decode_range`: K and V of key tile ``start`` (its block ids ``blk``/``kd``
    looked up one lap before) and the block ids of the slot's next tile, ``start + lap``."""
    k, v = _decode_kv_tile(k_head, v_head, table, blk, kd, qd, start, range_end, offs_n, offs_d, plane_offset,
                           plane_modulus, stride_cb, stride_co, stride_tp, stride_tb, BLOCK_N, BLOCK_SIZE, HEAD_DIM, DP,
                           HAS_KEY_DEPTH, KV_ALIGNED)
    blk, kd = _decode_tile_keys(own_plane_table, table, key_depth_ptr, start + lap, range_end, offs_n, BLOCK_N,
                                BLOCK_SIZE, stride_tb, stride_kdb, stride_kdo, HAS_KEY_DEPTH)
    return k, v, blk, kd


@triton.jit
def _range_keys(own_plane_table, table, key_depth_ptr, range_start, range_end, offs_n, stride_tb, stride_kdb,
                stride_kdo, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, HAS_KEY_DEPTH: tl.constexpr,
                TILES: tl.constexpr):
    """Block ids and key depths (`_decode_tile_keys`) of the first TILES key tiles of the range starting
    at range_start, one (blk, kd) pair per prefetch slot of `_decode_range` (slots past TILES repeat
    the first and go unused). Table reads only: they may precede the program's own K/V write."""
    blk_a, kd_a = _decode_tile_keys(own_plane_table, table, key_depth_ptr, range_start, range_end, offs_n, BLOCK_N,
                                    BLOCK_SIZE, stride_tb, stride_kdb, stride_kdo, HAS_KEY_DEPTH)
    blk_b, kd_b, blk_c, kd_c, blk_d, kd_d = blk_a, kd_a, blk_a, kd_a, blk_a, kd_a
    if TILES >= 2:
        blk_b, kd_b = _decode_tile_keys(own_plane_table, table, key_depth_ptr, range_start + BLOCK_N, range_end,
                                        offs_n, BLOCK_N, BLOCK_SIZE, stride_tb, stride_kdb, stride_kdo, HAS_KEY_DEPTH)
    if TILES >= 3:
        blk_c, kd_c = _decode_tile_keys(own_plane_table, table, key_depth_ptr, range_start + 2 * BLOCK_N, range_end,
                                        offs_n, BLOCK_N, BLOCK_SIZE, stride_tb, stride_kdb, stride_kdo, HAS_KEY_DEPTH)
    if TILES >= 4:
        blk_d, kd_d = _decode_tile_keys(own_plane_table, table, key_depth_ptr, range_start + 3 * BLOCK_N, range_end,
                                        offs_n, BLOCK_N, BLOCK_SIZE, stride_tb, stride_kdb, stride_kdo, HAS_KEY_DEPTH)
    return blk_a, kd_a, blk_b, kd_b, blk_c, kd_c, blk_d, kd_d


@triton.jit
def _decode_range(q, k_head, v_head, table, qd, own_plane_table, key_depth_ptr, range_start, range_end, offs_n, offs_d,
                  plane_offset, plane_modulus, stride_cb, stride_co, stride_tp, stride_tb, stride_kdb, stride_kdo,
                  blk_a, kd_a, blk_b, kd_b, blk_c, kd_c, blk_d, kd_d,
                  GP: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DP: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr, HAS_KEY_DEPTH: tl.constexpr, KV_ALIGNED: tl.constexpr,
                  TILES: tl.constexpr, PAIRS: tl.constexpr, WIDEN_INLINE: tl.constexpr):
    """Softmax state (m [GP], l [GP], acc [GP, DP], fp32) of one decode row's GP heads over keys
    [range_start, range_end): per-lane online softmax, lanes folded at the end. blk_a .. kd_d: the
    range's first block ids and key depths (`_range_keys`)."""
    m_i = tl.full([GP, BLOCK_N], float("-inf"), tl.float32)
    l_i = tl.zeros([GP, BLOCK_N], tl.float32)
    acc = tl.zeros([GP, BLOCK_N, DP], tl.float32)
    # TILES (1..4) prefetch slots: slot j holds key tile start + j * BLOCK_N of an iteration, its K/V
    # loaded one iteration (a lap of TILES tiles) ahead of the arithmetic and its block ids and key
    # depths two laps ahead. An iteration applies its tiles in key order, so a row's bits do not
    # depend on TILES.
    lap = TILES * BLOCK_N
    k_a, v_a, blk_a, kd_a = _slot_fetch(
        k_head, v_head, table, own_plane_table, key_depth_ptr, blk_a, kd_a, qd, range_start, lap, range_end,
        offs_n, offs_d, plane_offset, plane_modulus, stride_cb, stride_co, stride_tp, stride_tb, stride_kdb,
        stride_kdo, BLOCK_N, BLOCK_SIZE, HEAD_DIM, DP, HAS_KEY_DEPTH, KV_ALIGNED)
    if TILES >= 2:
        k_b, v_b, blk_b, kd_b = _slot_fetch(
            k_head, v_head, table, own_plane_table, key_depth_ptr, blk_b, kd_b, qd, range_start + BLOCK_N, lap,
            range_end, offs_n, offs_d, plane_offset, plane_modulus, stride_cb, stride_co, stride_tp, stride_tb,
            stride_kdb, stride_kdo, BLOCK_N, BLOCK_SIZE, HEAD_DIM, DP, HAS_KEY_DEPTH, KV_ALIGNED)
    if TILES >= 3:
        k_c, v_c, blk_c, kd_c = _slot_fetch(
            k_head, v_head, table, own_plane_table, key_depth_ptr, blk_c, kd_c, qd, range_start + 2 * BLOCK_N, lap,
            range_end, offs_n, offs_d, plane_offset, plane_modulus, stride_cb, stride_co, stride_tp, stride_tb,
            stride_kdb, stride_kdo, BLOCK_N, BLOCK_SIZE, HEAD_DIM, DP, HAS_KEY_DEPTH, KV_ALIGNED)
    if TILES >= 4:
        k_d, v_d, blk_d, kd_d = _slot_fetch(
            k_head, v_head, table, own_plane_table, key_depth_ptr, blk_d, kd_d, qd, range_start + 3 * BLOCK_N, lap,
            range_end, offs_n, offs_d, plane_offset, plane_modulus, stride_cb, stride_co, stride_tp, stride_tb,
            stride_kdb, stride_kdo, BLOCK_N, BLOCK_SIZE, HEAD_DIM, DP, HAS_KEY_DEPTH, KV_ALIGNED)
    for start in range(range_start, range_end, lap):
        ahead = start + lap
        k_next, v_next, blk_a, kd_a = _slot_fetch(
            k_head, v_head, table, own_plane_table, key_depth_ptr, blk_a, kd_a, qd, ahead, lap, range_end, offs_n,
            offs_d, plane_offset, plane_modulus, stride_cb, stride_co, stride_tp, stride_tb, stride_kdb, stride_kdo,
            BLOCK_N, BLOCK_SIZE, HEAD_DIM, DP, HAS_KEY_DEPTH, KV_ALIGNED)
        if TILES >= 2:
            k_next_b, v_next_b, blk_b, kd_b = _slot_fetch(
                k_head, v_head, table, own_plane_table, key_depth_ptr, blk_b, kd_b, qd, ahead + BLOCK_N, lap,
                range_end, offs_n, offs_d, plane_offset, plane_modulus, stride_cb, stride_co, stride_tp, stride_tb,
                stride_kdb, stride_kdo, BLOCK_N, BLOCK_SIZE, HEAD_DIM, DP, HAS_KEY_DEPTH, KV_ALIGNED)
        if TILES >= 3:
            k_next_c, v_next_c, blk_c, kd_c = _slot_fetch(
                k_head, v_head, table, own_plane_table, key_depth_ptr, blk_c, kd_c, qd, ahead + 2 * BLOCK_N, lap,
                range_end, offs_n, offs_d, plane_offset, plane_modulus, stride_cb, stride_co, stride_tp, stride_tb,
                stride_kdb, stride_kdo, BLOCK_N, BLOCK_SIZE, HEAD_DIM, DP, HAS_KEY_DEPTH, KV_ALIGNED)
        if TILES >= 4:
            k_next_d, v_next_d, blk_d, kd_d = _slot_fetch(
                k_head, v_head, table, own_plane_table, key_depth_ptr, blk_d, kd_d, qd, ahead + 3 * BLOCK_N, lap,
                range_end, offs_n, offs_d, plane_offset, plane_modulus, stride_cb, stride_co, stride_tp, stride_tb,
                stride_kdb, stride_kdo, BLOCK_N, BLOCK_SIZE, HEAD_DIM, DP, HAS_KEY_DEPTH, KV_ALIGNED)
        if PAIRS:  # (a, b), then (c, d): the pairs start at the range's even tiles whatever TILES is
            m_i, l_i, acc = _lane_update_pair(q, k_a, v_a, k_b, v_b, start, range_end, offs_n, m_i, l_i, acc, BLOCK_N,
                                              WIDEN_INLINE)
            k_a, v_a, k_b, v_b = k_next, v_next, k_next_b, v_next_b
            if TILES >= 4:
                if start + 2 * BLOCK_N < range_end:
                    m_i, l_i, acc = _lane_update_pair(q, k_c, v_c, k_d, v_d, start + 2 * BLOCK_N, range_end, offs_n,
                                                      m_i, l_i, acc, BLOCK_N, WIDEN_INLINE)
                k_c, v_c, k_d, v_d = k_next_c, v_next_c, k_next_d, v_next_d
        else:  # one tile at a time; a tile with no key is skipped, not applied
            m_i, l_i, acc = _lane_update(q, k_a, v_a, start, range_end, offs_n, m_i, l_i, acc, WIDEN_INLINE)
            k_a, v_a = k_next, v_next
            if TILES >= 2:
                if start + BLOCK_N < range_end:
                    m_i, l_i, acc = _lane_update(q, k_b, v_b, start + BLOCK_N, range_end, offs_n, m_i, l_i, acc,
                                                 WIDEN_INLINE)
                k_b, v_b = k_next_b, v_next_b
            if TILES >= 3:
                if start + 2 * BLOCK_N < range_end:
                    m_i, l_i, acc = _lane_update(q, k_c, v_c, start + 2 * BLOCK_N, range_end, offs_n, m_i, l_i, acc,
                                                 WIDEN_INLINE)
                k_c, v_c = k_next_c, v_next_c
            if TILES >= 4:
                if start + 3 * BLOCK_N < range_end:
                    m_i, l_i, acc = _lane_update(q, k_d, v_d, start + 3 * BLOCK_N, range_end, offs_n, m_i, l_i, acc,
                                                 WIDEN_INLINE)
                k_d, v_d = k_next_d, v_next_d
    # Fold the key lanes into one state per head.
    m_c = tl.max(m_i, 1)
    m_c_ref = tl.where(m_c > float("-inf"), m_c, 0.0)
    w = tl.exp2(m_i - m_c_ref[:, None])  # 0 for lanes that saw no key
    l_c = tl.sum(l_i * w, 1)
    acc_c = tl.sum(acc * w[:, :, None], 1)
    return m_c, l_c, acc_c


@triton.jit
def _write_own_kv(k_raw_ptr, v_raw_ptr, k_bias_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, token,
                  kvh, n_kv_heads, offs_d, partner, cos, signed_sin, stride_kt, stride_kh, stride_vt, stride_vh,
                  stride_kbh, stride_cb, stride_co, stride_ch, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                  HAS_K_BIAS: tl.constexpr, KV_FP8: tl.constexpr, UNFUSED: tl.constexpr):
    """`kv_cache.rope_kv_scatter`'s write of one token's KV head ``kvh``: k rotated (rounded to k's
    dtype, then the cache's), v copied, both at the token's slot (a negative slot writes nothing);
    then a barrier, so the program's later key loads see them."""
    slot = tl.load(slot_ptr + token)
    if slot >= 0:
        heads = kvh + tl.arange(0, 1)
        k = rotate_heads(k_raw_ptr, k_bias_ptr, token, heads, n_kv_heads, stride_kt, stride_kh, stride_kbh, offs_d,
                         partner, cos, signed_sin, HEAD_DIM, HAS_K_BIAS, False, UNFUSED)
        k = to_cache(k.to(k_raw_ptr.dtype.element_ty), k_cache_ptr, k_scale_ptr, heads, n_kv_heads, KV_FP8)
        mask = offs_d[None, :] < HEAD_DIM
        v = tl.load(v_raw_ptr + token * stride_vt + kvh.to(tl.int64) * stride_vh + offs_d[None, :], mask=mask)
        v = to_cache(v, v_cache_ptr, v_scale_ptr, heads, n_kv_heads, KV_FP8)
        dst = slot_offset(slot, BLOCK_SIZE, stride_cb, stride_co) + kvh.to(tl.int64) * stride_ch + offs_d[None, :]
        tl.store(k_cache_ptr + dst, k, mask=mask)
        tl.store(v_cache_ptr + dst, v, mask=mask)
    tl.debug_barrier()


@triton.jit
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, ws_ptr,
    tables_ptr, seq_lens_ptr, qsl_ptr, slots_ptr, qdepth_ptr, key_depth_ptr, active_ptr, decode_from_ptr,
    k_scale_ptr, v_scale_ptr, qk_scale, n_seqs, n_heads, qdepth_value, decode_from_value, plane_offset, plane_modulus,
    split_size, n_splits_max, ml_base, SPLIT: tl.constexpr,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_co, stride_ch,
    stride_tp, stride_ts, stride_tb, stride_kdb, stride_kdo, counters_ptr,
    GROUP: tl.constexpr, GP: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, HAS_ACTIVE: tl.constexpr, HAS_SLOTS: tl.constexpr, QDEPTH_TENSOR: tl.constexpr,
    HAS_KEY_DEPTH: tl.constexpr, DECODE_FROM_TENSOR: tl.constexpr, KV_FP8: tl.constexpr, PDL: tl.constexpr,
    TILES: tl.constexpr, MERGE_IN_PLACE: tl.constexpr, KV_ALIGNED: tl.constexpr, WIDEN_INLINE: tl.constexpr,
    rope_k_ptr, rope_v_ptr, pos_ptr, cos_sin_ptr, write_slot_ptr, q_bias_ptr, k_bias_ptr,
    stride_rkt, stride_rkh, stride_rvt, stride_rvh, stride_cs, stride_qbh, stride_kbh, n_kv_heads,
    ROPE: tl.constexpr, GPTJ: tl.constexpr, HAS_Q_BIAS: tl.constexpr, HAS_K_BIAS: tl.constexpr,
    UNFUSED: tl.constexpr, HEADS_FAST: tl.constexpr,
):
    """The decode arithmetic: one program per (query token, KV head), program ids (1, 0) with
    HEADS_FAST (a token's KV heads run side by side, reading its key rows together) else (0, 1),
    and with SPLIT (a split launch) per range program program_id(2), which takes every
    num_programs(2)-th key range of its row. Its GP query heads attend without tensor cores: every
    key lane n of a BLOCK_N tile keeps its own online-softmax state over keys n, n + BLOCK_N, ...
    of a range, folded across lanes at the range's end (`_decode_range`), so the loop needs no
    cross-thread exchange and a row's bits never depend on other rows. Tokens before their
    sequence's ``decode_from`` position are left to `_paged_attention_kernel`. A split row of more
    than one range stores each range's state to the workspace; MERGE_IN_PLACE: the last range
    program of the row to finish (counted on counters_ptr[token * KVH + kvh], which it puts back to
    zero) merges them itself, as `_decode_combine_kernel` would. SPLIT is a compile-time flag: the
    unsplit kernel keeps one plain loop over the row's ranges (a runtime range step and workspace
    stores in that loop cost unsplit launches 6-10%, H200).

    ROPE (`rope_paged_attention`, one query per sequence): q_ptr holds the unrotated q; the program
    rotates its heads' q in registers, and the program whose ranges hold the row's own key
    rotates that token's k, writes it and v into the cache at write_slot_ptr[token] (as
    `kv_cache.rope_kv_scatter` does, same bits) and passes a barrier before it reads any key."""
    wait_for_inputs(PDL)
    if HEADS_FAST:  # the grid is (KV heads, tokens, range programs)
        token_pid, kvh = tl.program_id(1), tl.program_id(0)
    else:
        token_pid, kvh = tl.program_id(0), tl.program_id(1)
    seq, token, position, idle = _locate_row(token_pid, qsl_ptr, active_ptr, seq_lens_ptr, n_seqs, HAS_ACTIVE)
    if idle:
        return
    if tl.maximum(position, 0) < _decode_from(decode_from_ptr, seq, decode_from_value, DECODE_FROM_TENSOR):
        return  # a prompt row: the tile kernel's
    limit = tl.maximum(position + 1, 0)  # keys this row sees
    n_ranges = (limit + split_size - 1) // split_size
    c_lo = tl.program_id(2)
    if c_lo >= tl.maximum(n_ranges, 1):
        return  # a split row's program past its ranges (range program 0 of a row that sees no key writes its zeros)

    g = tl.arange(0, GP)
    head = kvh * GROUP + g
    g_ok = g < GROUP
    offs_d = tl.arange(0, DP)
    offs_n = tl.arange(0, BLOCK_N)
    io_mask = _dim_mask(g_ok, offs_d, HEAD_DIM, DP)
    if SPLIT:
        c_step = tl.num_programs(2)
    else:
        c_step = 1  # (compile time: one plain loop)
    table, qd, own_plane_table, k_head, v_head = _sequence_planes(
        seq, kvh, tables_ptr, slots_ptr, qdepth_ptr, k_ptr, v_ptr, qdepth_value, plane_offset, plane_modulus,
        stride_ts, stride_tp, stride_ch, HAS_SLOTS, QDEPTH_TENSOR)
    if ROPE:
        # The first range's block ids are table reads: they go out before the prologue's K/V write
        # and barrier, so its own latency hides theirs (later ranges': at the end of the range before).
        blk_a, kd_a, blk_b, kd_b, blk_c, kd_c, blk_d, kd_d = _range_keys(
            own_plane_table, table, key_depth_ptr, c_lo * split_size, tl.minimum((c_lo + 1) * split_size, limit),
            offs_n, stride_tb, stride_kdb, stride_kdo, BLOCK_N, BLOCK_SIZE, HAS_KEY_DEPTH, TILES)
        partner, cos, signed_sin = rope_angles(cos_sin_ptr + tl.load(pos_ptr + token).to(tl.int64) * stride_cs,
                                               offs_d, HEAD_DIM, GPTJ)
        q = rotate_heads(q_ptr, q_bias_ptr, token, head, n_heads, stride_qt, stride_qh, stride_qbh, offs_d, partner,
                         cos, signed_sin, HEAD_DIM, HAS_Q_BIAS, False, UNFUSED).to(q_ptr.dtype.element_ty)
        q = tl.where(io_mask, q, 0.0)
        if c_lo == (tl.maximum(n_ranges, 1) - 1) % c_step:  # this program's ranges hold the row's own key
            _write_own_kv(rope_k_ptr, rope_v_ptr, k_bias_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, write_slot_ptr,
                          token, kvh, n_kv_heads, offs_d, partner, cos, signed_sin, stride_rkt, stride_rkh,
                          stride_rvt, stride_rvh, stride_kbh, stride_cb, stride_co, stride_ch, HEAD_DIM,
                          BLOCK_SIZE, HAS_K_BIAS, KV_FP8, UNFUSED)
    else:
        q = tl.load(q_ptr + token * stride_qt + head[:, None] * stride_qh + offs_d[None, :], mask=io_mask, other=0.0)
    if KV_FP8:  # FP8 K/V are widened exactly; K's scale joins the score scale, V's the output's
        qk_scale = qk_scale * tl.load(k_scale_ptr + kvh)
    q = (q.to(tl.float32) * qk_scale)[:, None, :]  # [GP, 1, DP]

    m_run = tl.full([GP], float("-inf"), tl.float32)
    l_run = tl.zeros([GP], tl.float32)
    acc_run = tl.zeros([GP, DP], tl.float32)
    many = n_ranges > 1  # a split row of several ranges: each goes to the workspace, merged once all are there
    for c in range(c_lo, n_ranges, c_step):
        range_start = c * split_size
        range_end = tl.minimum(range_start + split_size, limit)
        if not ROPE:  # (compile time) looked up here: carried between ranges, block ids cost the bf16
            # kernel 96 -> 99 registers, a program per SM
            blk_a, kd_a, blk_b, kd_b, blk_c, kd_c, blk_d, kd_d = _range_keys(
                own_plane_table, table, key_depth_ptr, range_start, range_end, offs_n, stride_tb, stride_kdb,
                stride_kdo, BLOCK_N, BLOCK_SIZE, HAS_KEY_DEPTH, TILES)
        m_c, l_c, acc_c = _decode_range(
            q, k_head, v_head, table, qd, own_plane_table, key_depth_ptr, range_start, range_end, offs_n, offs_d,
            plane_offset, plane_modulus, stride_cb, stride_co, stride_tp, stride_tb, stride_kdb, stride_kdo, blk_a,
            kd_a, blk_b, kd_b, blk_c, kd_c, blk_d, kd_d, GP, BLOCK_N, HEAD_DIM, DP, BLOCK_SIZE, HAS_KEY_DEPTH,
            KV_ALIGNED, TILES, KV_FP8, WIDEN_INLINE)
        if ROPE:  # the program's next range's block ids
            next_start = range_start + c_step * split_size
            blk_a, kd_a, blk_b, kd_b, blk_c, kd_c, blk_d, kd_d = _range_keys(
                own_plane_table, table, key_depth_ptr, next_start, tl.minimum(next_start + split_size, limit),
                offs_n, stride_tb, stride_kdb, stride_kdo, BLOCK_N, BLOCK_SIZE, HAS_KEY_DEPTH, TILES)
        if SPLIT and many:  # the range's own state (merged into an empty one, as the combine reads it)
            m_p, l_p, acc_p = _merge(tl.full([GP], float("-inf"), tl.float32), tl.zeros([GP], tl.float32),
                                     tl.zeros([GP, DP], tl.float32), m_c, l_c, acc_c)
            idx = (token * n_heads + head) * n_splits_max + c
            tl.store(ws_ptr + idx[:, None] * HEAD_DIM + offs_d[None, :], acc_p, mask=io_mask)
            tl.store(ws_ptr + ml_base + 2 * idx, m_p, mask=g_ok)
            tl.store(ws_ptr + ml_base + 2 * idx + 1, l_p, mask=g_ok)
        else:
            m_run, l_run, acc_run = _merge(m_run, l_run, acc_run, m_c, l_c, acc_c)
    if SPLIT and many:
        if MERGE_IN_PLACE:
            # Every thread's stores precede the count (barrier, then a release at GPU scope); the
            # last program's acquire orders its reads, which bypass L1 (".cg"), after all of them.
            tl.debug_barrier()
            counter = counters_ptr + token * n_kv_heads + kvh
            done = (n_ranges - c_lo + c_step - 1) // c_step  # ranges this program stored
            if tl.atomic_add(counter, done, sem="acq_rel", scope="gpu") == n_ranges - done:
                l_all, acc_all = _merge_ranges(ws_ptr, ml_base, (token * n_heads + head) * n_splits_max, n_ranges,
                                               g_ok, offs_d, io_mask, GP, HEAD_DIM, DP, ".cg")
                _store_output(out_ptr, token + g * 0, head, stride_ot, stride_oh, offs_d, io_mask, l_all, acc_all,
                              v_scale_ptr, kvh, KV_FP8)
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
    else:
        _store_output(out_ptr, token + g * 0, head, stride_ot, stride_oh, offs_d, io_mask, l_run, acc_run, v_scale_ptr,
                      kvh, KV_FP8)


@triton.jit
def _decode_combine_kernel(
    out_ptr, ws_ptr, seq_lens_ptr, qsl_ptr, active_ptr, decode_from_ptr, v_scale_ptr,
    n_seqs, n_heads, decode_from_value, split_size, n_splits_max, ml_base, stride_ot, stride_oh,
    GROUP: tl.constexpr, GP: tl.constexpr, HEAD_DIM: tl.constexpr, DP: tl.constexpr, HAS_ACTIVE: tl.constexpr,
    DECODE_FROM_TENSOR: tl.constexpr, KV_FP8: tl.constexpr, PDL: tl.constexpr,
):
    """Merge one decode row's key-range partials in order 0, 1, 2, ... with `_merge` and write
    it; a row whose keys fit one range was written by its range program."""
    wait_for_inputs(PDL)
    seq, token, position, idle = _locate_row(tl.program_id(0), qsl_ptr, active_ptr, seq_lens_ptr, n_seqs, HAS_ACTIVE)
    if idle:
        return
    if tl.maximum(position, 0) < _decode_from(decode_from_ptr, seq, decode_from_value, DECODE_FROM_TENSOR):
        return  # a prompt row: the tile kernel's
    limit = tl.maximum(position + 1, 0)
    n_ranges = (limit + split_size - 1) // split_size
    if n_ranges == 1:
        return  # the range program wrote this row itself (a row with no key gets zeros below)
    kvh = tl.program_id(1)
    g = tl.arange(0, GP)
    head = kvh * GROUP + g
    g_ok = g < GROUP
    offs_d = tl.arange(0, DP)
    io_mask = _dim_mask(g_ok, offs_d, HEAD_DIM, DP)
    l_run, acc_run = _merge_ranges(ws_ptr, ml_base, (token * n_heads + head) * n_splits_max, n_ranges, g_ok, offs_d,
                                   io_mask, GP, HEAD_DIM, DP, "")
    _store_output(out_ptr, token + g * 0, head, stride_ot, stride_oh, offs_d, io_mask, l_run, acc_run, v_scale_ptr, kvh,
                  KV_FP8)


@triton.jit
def _merge_ranges(ws_ptr, ml_base, base, n_ranges, g_ok, offs_d, io_mask, GP: tl.constexpr, HEAD_DIM: tl.constexpr,
                  DP: tl.constexpr, CACHE: tl.constexpr):
    """(l, acc) of one decode row's GP heads: its key-range partials at workspace entries base + c
    merged with `_merge` in order c = 0, 1, 2, ...; loads with cache modifier CACHE."""
    m_run = tl.full([GP], float("-inf"), tl.float32)
    l_run = tl.zeros([GP], tl.float32)
    acc_run = tl.zeros([GP, DP], tl.float32)
    for c in range(0, n_ranges):
        idx = base + c
        m_part = tl.load(ws_ptr + ml_base + 2 * idx, mask=g_ok, other=float("-inf"), cache_modifier=CACHE)
        l_part = tl.load(ws_ptr + ml_base + 2 * idx + 1, mask=g_ok, other=0.0, cache_modifier=CACHE)
        acc_part = tl.load(ws_ptr + idx[:, None] * HEAD_DIM + offs_d[None, :], mask=io_mask, other=0.0,
                           cache_modifier=CACHE)
        m_run, l_run, acc_run = _merge(m_run, l_run, acc_run, m_part, l_part, acc_part)
    return l_run, acc_run


# ---------------------------------------------------------------------------------------------
# Launch configuration: fixed by the group size, head_dim and dtype; never by the batch.
# ---------------------------------------------------------------------------------------------

# A tile has 64 rows (the smallest Hopper wgmma tile): prompt rows of a chunk fill it (MHA decode,
# which would use 1 of 64 rows, runs the decode kernel instead).
MIN_TILE_ROWS = 64
# Tile launches with at most this many query tokens per sequence on average (small prefill chunks)
# skip the key loop's software pipeline: its shared-memory stages cap the CTAs per SM of a kernel
# whose tiles hold a few useful rows (H200, measured when decode still ran this kernel: -12% at
# 256 one-query sequences; a 2K prefill is 16% slower without it).
FEW_QUERIES_PER_SEQ = 8
# Split the keys only when the unsplit launch has fewer tile programs than this many per SM.
SPLIT_BELOW_PROGRAMS_PER_SM = 2
# The decode kernel: GP x BLOCK_N key lanes per program and its warps. Both shape the reduction
# trees, so they are constants of the arithmetic, never tuned per batch. H200, Ouro decode (4 planes,
# key-depth reads): 16 lanes x 4 warps reads K/V at 67% of the copy bandwidth at 256 x 192 keys and
# 86% at 256 x 1024 (32 x 4: 51% / 71%; 64 x 4: 45% / 65%). K/V are prefetched one tile ahead by the
# kernel itself; Triton's pipeliner adds nothing for loads no dot consumes (stages 1..3 measured equal).
DECODE_LANE_ELEMENTS = 16
DECODE_WARPS = 4
# Over FP8 caches the decode kernel runs fewer warps: its code outside the key loop (prologue, lane
# fold, store) is issued once a warp, and the full launches of batches 128-256 are bound by the
# instructions they issue. H100, Ouro decode without key depths, us per call, 4 warps capped at 96
# registers -> 2 warps capped at 128: 256 x 150 keys 78.2 -> 67.7, 256 x 192 88.3 -> 79.5, 128 x 192
# 50.2 -> 45.5, 256 x 1024 378.1 -> 355.4, 64 x 192 27.7 -> 27.8, 16 x 192 9.9 -> 9.6, 1 x 192 5.6 ->
# 6.8. With one query head per KV head (GP = 1) one warp, uncapped (254 registers, no spill: sm_90,
# Triton 3.6), issues about 17% fewer warp instructions a row at 150 keys than 2 warps; H100, us per
# call, 2 warps capped at 128 -> 1 warp: 256 x 150 keys 68.3 -> 65.7, 256 x 192 80.9 -> 77.6, 128 x
# 192 45.8 -> 41.4, 64 x 192 27.5 -> 22.0, 16 x 192 8.4 -> 8.4, 1 x 192 6.6 -> 7.6 (caps of 192 and
# 168 registers were slower at every shape); the W8A8 + FP8 K/V engine, ms a step: batch 1 4.42 ->
# 4.51, 64 6.79 -> 6.44, 128 9.46 -> 9.24, 256 13.46 -> 13.43 (docs/perf/fp8.md, session 46).
# Grouped heads hold GP accumulators a lane and keep 2 warps. Caches in q's dtype keep 4: 2 warps
# took their batch-1 call 6.8 -> 11.5 us (256 x 150: 123.6 -> 115.0). Warps shape the reduction
# trees, so each (cache dtype, group) keeps one count at every batch (`decode_warps`).
DECODE_WARPS_FP8 = 1
DECODE_WARPS_FP8_GROUPED = 2
DECODE_STAGES = 1
# Key tiles the decode kernel keeps in flight (loads issued ahead of the arithmetic; 1..4, any value
# gives the same bits): four where the launch has at most one (token, KV head) per SM, each program
# then bound by load latency, one in fuller launches. H200, Ouro 16 x 128: 1 -> 2 tiles at batch 1 x
# 192 keys 10.2 -> 9.4 us, 1 x 4096 keys 46.7 -> 35.6 us; 2 -> 4 tiles in the decode chain of 96
# layer-loops (perf.bench_decode_chain, 64-key-range tables of 4K keys) 4.461 -> 4.333 ms at batch 1
# and 4.698 -> 4.562 at batch 4 (3 tiles: 4.388 / 4.593); batch 64 x 192 keys 38.3 us with one
# tile against 44.5 with two and 51.2 with four.
DECODE_TILES_SMALL_LAUNCH = 4
DECODE_TILES = 1
# FP8 caches (read as int32 words, `widen_fp8_words`) keep two key tiles in flight in every launch:
# a tile is half the bytes of a bf16 one. H200, Ouro decode, us per call, per-byte cast with the
# tiles above -> words with two tiles (same bits): 1 x 192 keys 9.6 -> 8.1, 16 x 192 14.3 -> 13.5,
# 64 x 192 32.8 -> 28.0, 256 x 192 118.4 -> 98.6, 256 x 1024 481.7 -> 361.8, 64 x 4096 485.2 -> 361.1,
# 16 x 32K 968.4 -> 735.6 (words with one tile: 8.5, 13.0, 34.4, 112.9, 461.2, 508.1, 857.1).
# The FP8 decode arithmetic applies key tiles in pairs (`_lane_update_pair`): 2 or 4 tiles in flight
# (the same bits either way), never an odd count. With one block id per tile, K rows unmasked and the
# pairs, the unsplit key loop at Ouro's shape takes 279 sm_90 instructions a lap of two tiles, 328
# before (Triton 3.6, 4 warps capped at 96 registers). H100, us per call: 1 x 192 keys 6.5 -> 5.6, 16 x 192
# 11.1 -> 10.0, 64 x 192 29.0 -> 28.2, 256 x 192 90.8 -> 92.0; with K/V resident in L2 (every row on
# the same blocks: the instruction-bound time) 256 x 192 62.4 -> 56.1, 256 x 1024 223.5 -> 183.5.
DECODE_TILES_FP8 = 2


def decode_warps(kv_fp8: bool, group_heads: int) -> int:
    """Warps of a decode program: over an FP8 cache DECODE_WARPS_FP8 with one query head per KV
    head (``group_heads``, the padded group GP), else DECODE_WARPS_FP8_GROUPED; over caches in q's
    dtype DECODE_WARPS. A function of the model's shape and cache dtype alone (warps shape the
    reduction trees)."""
    if not kv_fp8:
        return DECODE_WARPS
    return DECODE_WARPS_FP8 if group_heads == 1 else DECODE_WARPS_FP8_GROUPED


def decode_tiles(kv_fp8: bool, small: bool) -> int:
    """Key tiles the decode kernel keeps in flight: over an FP8 cache, in a small launch (at most
    one (token, KV head) row per SM), or in a fuller one."""
    if kv_fp8:
        if DECODE_TILES_FP8 not in (2, 4):
            raise ValueError(f"DECODE_TILES_FP8 must be 2 or 4 (FP8 key tiles go in pairs), got {DECODE_TILES_FP8}")
        return DECODE_TILES_FP8
    return DECODE_TILES_SMALL_LAUNCH if small else DECODE_TILES
# Programs per SM a split decode launch aims for (`_decode_range_programs`). H200, Ouro 16 x 128,
# tables as wide as a 64K context (64 ranges), against a program per range: batch 16 x 192 keys
# 18.0 -> 10.2 us, x 32K keys 1090 -> 1077 (one program per row, each row's ranges in series:
# 1553); batch 1 x 192 keys 7.1 -> 6.4, x 4096 32.2 -> 23.2, x 32K 74 -> 82.
DECODE_RANGE_PROGRAMS_PER_SM = 2
# `rope_paged_attention` rotates q and writes the token's K/V inside the decode launch only while the
# launch has fewer (token, KV head) programs than this per SM. Its prologue costs the unsplit bf16
# kernel registers (96 -> 99 at sm_90, one program per SM less), and full launches (many programs per
# SM) lose more to it than a separate `rope_kv_scatter` costs (same bits either way). The fused
# program looks its first block ids up before the prologue. H100, Ouro decode, 192 keys, us per call,
# two kernels -> fused: batch 64 FP8 cache 34.5 -> 31.6, bf16 49.2 -> 46.7; batch 256 FP8 96.6 -> 97.1,
# bf16 157.7 -> 163.9. (H200, the bf16 decode chain of perf.bench_decode_chain, ms per step: batch 1
# 4.449 -> 4.333, 16: 5.447 -> 5.303, 64: 8.048 -> 8.000, 256: 18.68 -> 19.91.)
FUSED_ROPE_BELOW_PROGRAMS_PER_SM = 8
# Over FP8 caches every decode launch fuses: the 2-warp kernel then under a 128-register cap compiled
# the prologue at the same registers and stack (sm_90, Triton 3.6), as the 1-warp kernel does uncapped
# (252-254 registers, no spill). H100, the W8A8 + FP8 K/V engine at batch 256, ms a step, two kernels ->
# fused, alternating (2 warps): 13.96 -> 13.76, 13.93 -> 13.82 (with 4 warps capped at 96 it had cost
# 15.14 -> 15.21).
FUSED_ROPE_EVERY_FP8_LAUNCH = True
# Decode grids put the KV heads on grid dimension 0 (a token's heads launch together and read its
# 2 KiB key rows side by side; same bits). H200, Ouro decode, us per call, tokens first -> heads
# first: FP8 cache 256 x 1024 keys 321.8 -> 312.2, 256 x 192 86.4 -> 85.3; bf16 256 x 1024 559.6 ->
# 548.9, 256 x 192 130.7 -> 128.2 (batches 1-128 within 2%, either way); engines at batch 256, ms a
# step: bf16 18.78 -> 18.54, W8A8 + FP8 K/V 13.61 / 13.59 -> 13.46 / 13.46 (its device time within
# 0.2%). Grid dimension 1 holds at most MAX_GRID_Y tokens: larger launches keep the tokens on dimension 0.
DECODE_HEADS_FAST = True
MAX_GRID_Y = 65535
# Largest workspace the call allocates by itself when it decides to split (no workspace given).
AUTO_WORKSPACE_BYTES = 256 << 20
# decode_from=None: no row takes the decode arithmetic.
_NO_DECODE_ROWS = 2**31 - 1


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _tile_shape(num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, few_queries: bool = False) -> dict:
    """The tile geometry (a function of the model shape alone) and launch knobs. ``few_queries``
    (decode and speculative verification) runs the key loop unpipelined: the software pipeline
    only changes when loads are issued, never the arithmetic, so the bits are the same."""
    group = num_heads // num_kv_heads
    gp = _next_pow2(group)
    block_m = max(MIN_TILE_ROWS, gp)
    dp = max(16, _next_pow2(head_dim))
    return dict(
        GROUP=group, GP=gp, QPT=block_m // gp, BLOCK_M=block_m, HEAD_DIM=head_dim, DP=dp,
        num_warps=4 if block_m * dp <= 64 * 128 and dtype != torch.float32 else 8,
        num_stages=1 if few_queries else 2 if dtype == torch.float32 or dp > 128 else 3,
    )


def _decode_shape(num_heads: int, num_kv_heads: int, head_dim: int, kv_fp8: bool) -> dict:
    """The decode kernel's geometry (a function of the model shape and the cache dtype alone: it
    fixes the bits): the group's heads padded to a power of two, DECODE_LANE_ELEMENTS / GP key
    lanes, and the warps of the cache's kind."""
    group = num_heads // num_kv_heads
    gp = _next_pow2(group)
    return dict(GROUP=group, GP=gp, BLOCK_N=max(16, DECODE_LANE_ELEMENTS // gp), HEAD_DIM=head_dim,
                DP=max(16, _next_pow2(head_dim)), num_warps=decode_warps(kv_fp8, gp))


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 0  # the interpreter never splits on its own
    return torch.cuda.get_device_properties(device).multi_processor_count


def _should_split(programs: int, num_ranges: int, needed: int, workspace, device: torch.device) -> bool:
    """Fixed rule: split the keys across programs when the unsplit launch leaves the GPU idle
    (fewer than SPLIT_BELOW_PROGRAMS_PER_SM tile programs per SM), there is more than one key
    range, and a big enough workspace is given (or needs at most AUTO_WORKSPACE_BYTES).
    Splitting never changes the output bits, so this may depend on anything."""
    if num_ranges < 2 or programs >= SPLIT_BELOW_PROGRAMS_PER_SM * _sm_count(device):
        return False
    if workspace is not None:
        return workspace.numel() >= needed
    return needed * 4 <= AUTO_WORKSPACE_BYTES


def _kv_rows_aligned(k_cache: torch.Tensor) -> bool:
    """Whether every key row of the cache [blocks, block_size, KVH, D] (and each head's part of
    it) starts at a multiple of 16 elements, so that the attention kernels may load K/V tiles in
    16-byte vectors (Triton 3.9 cannot infer it through the block-table lookups: it read them 2
    bytes at a time and left the tile kernel's K/V out of its copy pipeline)."""
    return all(s % 16 == 0 for s in k_cache.stride()[:3])


def _check_split_size(split_size) -> int:
    split = DEFAULT_SPLIT_SIZE if split_size is None else int(split_size)
    if split <= 0 or split % KEY_TILE:
        raise ValueError(f"split_size must be a positive multiple of {KEY_TILE}, got {split_size}")
    return split


def attention_workspace_size(num_tokens: int, num_heads: int, head_dim: int, max_context_len: int,
                             split_size: int | None = None) -> int:
    """fp32 elements of a workspace that lets `paged_attention` split any call with up to
    ``num_tokens`` query tokens and block tables covering ``max_context_len`` keys
    (max_blocks * block_size)."""
    split = _check_split_size(split_size)
    num_ranges = -(-max_context_len // split)
    return num_tokens * num_heads * num_ranges * (head_dim + 2)


def _decode_range_programs(rows: int, num_ranges: int, device: torch.device) -> int:
    """Range programs per (token, KV head) of a split decode launch: enough for
    DECODE_RANGE_PROGRAMS_PER_SM programs per SM, at most one per key range. A program takes every
    n-th range, so a table as wide as the context limit does not launch a program per range when
    the rows' keys fill a few (which program computes a range never changes its bits)."""
    want = -(-int(DECODE_RANGE_PROGRAMS_PER_SM * _sm_count(device)) // rows)
    return max(1, min(num_ranges, want))


# Decode launches split their keys only while (tokens x KV heads) is below
# SPLIT_BELOW_PROGRAMS_PER_SM per SM: counters for that many rows of the largest GPUs.
RANGE_COUNTERS = 4096


def new_range_counters(device=None) -> torch.Tensor:
    """Zeroed int32 counters with which split decode launches merge their key ranges in place
    (the last range program of a row merges; it puts its counter back to zero)."""
    return torch.zeros(RANGE_COUNTERS, dtype=torch.int32, device=device)


def new_attention_workspace(num_tokens: int, num_heads: int, head_dim: int, max_context_len: int, *,
                            split_size: int | None = None, device=None) -> torch.Tensor:
    """Allocate the workspace sized by `attention_workspace_size` (fp32, contiguous)."""
    n = attention_workspace_size(num_tokens, num_heads, head_dim, max_context_len, split_size)
    return torch.empty(n, dtype=torch.float32, device=device)


def _check_kv_scales(k_cache, v_cache, k_scale, v_scale) -> None:
    """FP8 caches need fp32 scales [KVH]; caches in another dtype take none."""
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"k_cache and v_cache must share a dtype, got {k_cache.dtype} and {v_cache.dtype}")
    check_kv_scales(k_cache, k_scale, v_scale)


def _check_int(name, t, dtypes=(torch.int32,), dim=1):
    if t.dtype not in dtypes or t.dim() != dim:
        raise ValueError(f"{name} must be a {dim}-D tensor of {[str(d) for d in dtypes]}, got "
                         f"{t.dim()}-D {t.dtype}")


def _rope_args(rope, q, kvh: int) -> dict:
    """The decode kernel's RoPE arguments: `rope_paged_attention`'s inputs, or inert ones."""
    if rope is None:
        return dict(rope_k_ptr=q, rope_v_ptr=q, pos_ptr=q, cos_sin_ptr=q, write_slot_ptr=q, q_bias_ptr=q, k_bias_ptr=q,
                    stride_rkt=0, stride_rkh=0, stride_rvt=0, stride_rvh=0, stride_cs=0, stride_qbh=0, stride_kbh=0,
                    n_kv_heads=kvh, ROPE=False, GPTJ=False, HAS_Q_BIAS=False, HAS_K_BIAS=False, UNFUSED=False)
    k, v, positions, cos_sin, slots, q_bias, k_bias, gptj = rope
    return dict(rope_k_ptr=k, rope_v_ptr=v, pos_ptr=positions, cos_sin_ptr=cos_sin, write_slot_ptr=slots,
                q_bias_ptr=q if q_bias is None else q_bias, k_bias_ptr=k if k_bias is None else k_bias,
                stride_rkt=k.stride(0), stride_rkh=k.stride(1), stride_rvt=v.stride(0), stride_rvh=v.stride(1),
                stride_cs=cos_sin.stride(0), stride_qbh=0 if q_bias is None else q_bias.stride(0),
                stride_kbh=0 if k_bias is None else k_bias.stride(0), n_kv_heads=kvh, ROPE=True, GPTJ=gptj,
                HAS_Q_BIAS=q_bias is not None, HAS_K_BIAS=k_bias is not None, UNFUSED=not interpreter_active())


def paged_attention(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *,
    scale=None, out=None, workspace=None, seq_slots=None, query_depth=None, key_depth=None,
    plane_offset=0, plane_modulus=None, active_seqs=None, split_size=None, decode_from=None,
    k_scale=None, v_scale=None, range_counters=None,
):
    """Paged attention (Triton). Same arguments and semantics as `paged_attention_reference`;
    see the module docstring for layouts, the loop-depth plane map, the two arithmetics and the
    split rules.

    q [T, H, D] bf16/fp16/fp32; k/v_cache [num_blocks, block_size, KVH, D] (same dtype);
    block_tables int32 [S_rows, max_blocks] or [P, S_rows, max_blocks]; seq_lens int32 [S];
    query_start_loc int32 [S + 1]; out [T, H, D] (default: new, q's dtype); workspace fp32
    (see `attention_workspace_size`); decode_from None, an int or int32 [S]; k_scale, v_scale
    fp32 [KVH] with float8_e4m3fn caches (else None); range_counters int32 from
    `new_range_counters` (zero between calls; one per stream) lets a split decode launch merge its
    key ranges without the combine kernel. Returns out.
    """
    return _attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale=scale, out=out,
                      workspace=workspace, seq_slots=seq_slots, query_depth=query_depth, key_depth=key_depth,
                      plane_offset=plane_offset, plane_modulus=plane_modulus, active_seqs=active_seqs,
                      split_size=split_size, decode_from=decode_from, k_scale=k_scale, v_scale=v_scale,
                      range_counters=range_counters)


def check_own_sequences(seq_slots, active_seqs) -> None:
    """ValueError unless the live rows of a `rope_paged_attention` pass hold distinct sequence
    slots: rows of one sequence would read keys that other programs of the fused launch write.
    Checked only where it needs no device sync (CPU tensors: the references and the interpreter)."""
    if seq_slots is None or seq_slots.device.type != "cpu":
        return
    live = seq_slots.shape[0] if active_seqs is None else min(int(active_seqs[0]), seq_slots.shape[0])
    if torch.unique(seq_slots[:live]).numel() != live:
        raise ValueError("rope_paged_attention takes one query per sequence: live rows share seq_slots "
                         f"{seq_slots[:live].tolist()}; rows that read each other's keys need rope_kv_scatter, "
                         "then paged_attention")


def rope_then_attend(rope_kv_scatter, paged_attention):
    """`rope_paged_attention`'s contract as two ops one after the other: ``rope_kv_scatter`` (live
    rows: the live sequences, one query each), then ``paged_attention`` with the decode arithmetic.
    The reference, the fuller launches and backends without the fused form run it."""
    def call(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, block_tables, seq_lens, query_start_loc, *,
             style="neox", q_bias=None, k_bias=None, k_scale=None, v_scale=None, active_seqs=None, **attention_kwargs):
        check_own_sequences(attention_kwargs.get("seq_slots"), active_seqs)
        scales = {} if k_scale is None else dict(k_scale=k_scale, v_scale=v_scale)
        q_rot = rope_kv_scatter(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, style=style, q_bias=q_bias,
                                k_bias=k_bias, active_rows=active_seqs, **scales)
        return paged_attention(q_rot, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                               active_seqs=active_seqs, decode_from=0, **scales, **attention_kwargs)

    return call


rope_paged_attention_reference = rope_then_attend(rope_kv_scatter_reference, paged_attention_reference)
_rope_then_attend = rope_then_attend(rope_kv_scatter, paged_attention)


def rope_paged_attention(
    q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, block_tables, seq_lens, query_start_loc, *,
    style="neox", q_bias=None, k_bias=None, k_scale=None, v_scale=None, active_seqs=None, **attention_kwargs,
):
    """`rope_kv_scatter` then `paged_attention` with the decode arithmetic, for passes with one
    query token per sequence (decode steps and draft passes) in which no row reads a key another
    row writes. Launches over an FP8 cache, and others of fewer than FUSED_ROPE_BELOW_PROGRAMS_PER_SM
    (token, KV head) programs per SM, run as one: the decode program rotates q in registers and
    writes its KV head's rotated k and v at the token's slot before it reads keys, so no rotated q
    goes through memory and no scatter kernel runs. Nothing orders one program's write before
    another program's reads, so rows that share a sequence's keys (a speculative round's verify
    rows) must take the two ops. Fuller bf16 or fp32 launches run the two kernels. Same bits either
    way.

    q [S, H, D] (unrotated), k, v [S, KVH, D], positions [S], cos_sin [P, D] fp32, slot_mapping [S]
    int64, style / q_bias / k_bias as in `rope_kv_scatter`; seq_lens [S]; query_start_loc [S + 1]
    must be 0, 1, ..., S (not checked on the device). active_seqs limits both the writes and the
    rows attended. The other keywords are `paged_attention`'s (decode_from is 0). Returns out.
    """
    check_rope_inputs(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, style=style, q_bias=q_bias,
                      k_bias=k_bias, active_rows=active_seqs, k_scale=k_scale, v_scale=v_scale)
    if seq_lens.shape[0] != q.shape[0]:
        raise ValueError(f"rope_paged_attention takes one query per sequence: q has {q.shape[0]} rows for "
                         f"{seq_lens.shape[0]} sequences")
    if "decode_from" in attention_kwargs:
        raise ValueError("rope_paged_attention always takes the decode arithmetic (decode_from=0)")
    check_launchable(k, v, positions, cos_sin, slot_mapping, q_bias, k_bias)
    if not _fuses_rope(q.shape[0] * k_cache.shape[2], q.device, k_cache.dtype == FP8_DTYPE):
        return _rope_then_attend(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, block_tables, seq_lens,
                                 query_start_loc, style=style, q_bias=q_bias, k_bias=k_bias, k_scale=k_scale,
                                 v_scale=v_scale, active_seqs=active_seqs, **attention_kwargs)
    check_own_sequences(attention_kwargs.get("seq_slots"), active_seqs)
    rope = (k, v, positions, cos_sin, slot_mapping, q_bias, k_bias, style == "gptj")
    return _attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, decode_from=0, k_scale=k_scale,
                      v_scale=v_scale, active_seqs=active_seqs, rope=rope, **attention_kwargs)


def _fuses_rope(programs: int, device: torch.device, kv_fp8: bool = False) -> bool:
    """Whether a decode launch of ``programs`` (token, KV head) programs rotates and writes K/V
    itself: over an FP8 cache (``kv_fp8``) always (FUSED_ROPE_EVERY_FP8_LAUNCH), otherwise below
    FUSED_ROPE_BELOW_PROGRAMS_PER_SM per SM, and always under the interpreter (no SM count). Either
    way gives the same bits."""
    sms = _sm_count(device)
    return (sms == 0 or (kv_fp8 and FUSED_ROPE_EVERY_FP8_LAUNCH)
            or programs < FUSED_ROPE_BELOW_PROGRAMS_PER_SM * sms)


def _attention(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *,
    scale=None, out=None, workspace=None, seq_slots=None, query_depth=None, key_depth=None,
    plane_offset=0, plane_modulus=None, active_seqs=None, split_size=None, decode_from=None,
    k_scale=None, v_scale=None, range_counters=None, rope=None,
):
    """`paged_attention`; rope: `rope_paged_attention`'s (k, v, positions, cos_sin, slot_mapping,
    q_bias, k_bias, gptj) for the decode launch."""
    if range_counters is not None and (range_counters.dtype != torch.int32 or range_counters.device != q.device):
        raise ValueError("range_counters must be an int32 tensor on q's device (new_range_counters)")
    check_launchable(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, workspace,
                     seq_slots, key_depth, active_seqs, k_scale, v_scale,
                     query_depth if isinstance(query_depth, torch.Tensor) else None,
                     decode_from if isinstance(decode_from, torch.Tensor) else None)
    if q.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(f"q must be [T, H, D] and k_cache [blocks, block_size, KVH, D]; got "
                         f"{tuple(q.shape)} and {tuple(k_cache.shape)}")
    t_total, h, d = q.shape
    _, block_size, kvh, d_cache = k_cache.shape
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride():
        raise ValueError("k_cache and v_cache must have the same shape and strides")
    if d_cache != d or h % kvh:
        raise ValueError(f"q [T, {h}, {d}] does not fit a cache with {kvh} kv heads of dim {d_cache}")
    if q.dtype not in _KERNEL_DTYPES or k_cache.dtype not in (q.dtype, FP8_DTYPE) or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"q, k_cache and v_cache must share one of {_KERNEL_DTYPES} (or the caches be "
                         f"float8_e4m3fn); got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    _check_kv_scales(k_cache, v_cache, k_scale, v_scale)
    kv_fp8 = k_cache.dtype == FP8_DTYPE
    if d > 256:
        raise ValueError(f"head_dim {d} > 256 is not supported")
    out = torch.empty_like(q) if out is None else out
    if out.shape != q.shape:
        raise ValueError(f"out must have q's shape {tuple(q.shape)}, got {tuple(out.shape)}")
    for name, t in (("q", q), ("out", out), ("k_cache", k_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension")
    _check_int("seq_lens", seq_lens)
    _check_int("query_start_loc", query_start_loc)
    n_seqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != n_seqs + 1:
        raise ValueError(f"query_start_loc must have {n_seqs + 1} entries, got {query_start_loc.shape[0]}")
    tables = block_tables if block_tables.dim() == 3 else block_tables.unsqueeze(0)
    _check_int("block_tables", tables, dim=3)
    num_planes = tables.shape[0]
    modulus = (num_planes - plane_offset) if plane_modulus is None else int(plane_modulus)
    if plane_offset < 0 or modulus < 1 or plane_offset + modulus > num_planes:
        raise ValueError(f"planes plane_offset..plane_offset+plane_modulus-1 ({plane_offset}, "
                         f"{modulus}) must lie within the {num_planes} block-table planes")
    if seq_slots is not None:
        _check_int("seq_slots", seq_slots)
    if isinstance(query_depth, torch.Tensor):
        _check_int("query_depth", query_depth)
    if key_depth is not None:
        _check_int("key_depth", key_depth, _INT_DTYPES, dim=2)
    if active_seqs is not None:
        _check_int("active_seqs", active_seqs)
    decode_tensor = isinstance(decode_from, torch.Tensor)
    if decode_tensor:
        _check_int("decode_from", decode_from)
        if decode_from.shape[0] < n_seqs:
            raise ValueError(f"decode_from must have an entry per sequence ({n_seqs}), got {decode_from.shape[0]}")
    split = _check_split_size(split_size)
    if workspace is not None and (workspace.dtype != torch.float32 or not workspace.is_contiguous()):
        raise ValueError("workspace must be a contiguous fp32 tensor")
    if t_total == 0 or n_seqs == 0:
        return out

    num_ranges = -(-tables.shape[2] * block_size // split)
    needed = attention_workspace_size(t_total, h, d, tables.shape[2] * block_size, split)
    decode_value = 0 if decode_tensor else _NO_DECODE_ROWS if decode_from is None else int(decode_from)
    tile_rows = decode_tensor or decode_value > 0  # some rows may precede decode_from
    decode_rows = decode_tensor or decode_from is not None
    qdepth_tensor = isinstance(query_depth, torch.Tensor)
    active = active_seqs if active_seqs is not None else seq_lens
    # Both kernels take the same pointers and scalars; rows are split between them by decode_from.
    ptrs = (q, k_cache, v_cache, out, workspace, tables, seq_lens, query_start_loc,
            seq_slots if seq_slots is not None else seq_lens,
            query_depth if qdepth_tensor else seq_lens,
            key_depth if key_depth is not None else seq_lens,
            active, decode_from if decode_tensor else seq_lens,
            k_scale if kv_fp8 else seq_lens, v_scale if kv_fp8 else seq_lens)
    scalars = (float(scale if scale is not None else 1.0 / math.sqrt(d)) * _LOG2E,
               n_seqs, h, 0 if qdepth_tensor or query_depth is None else int(query_depth), decode_value,
               plane_offset, modulus, split, num_ranges)
    strides = (q.stride(0), q.stride(1), out.stride(0), out.stride(1),
               k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
               tables.stride(0), tables.stride(1), tables.stride(2),
               key_depth.stride(0) if key_depth is not None else 0,
               key_depth.stride(1) if key_depth is not None else 0)
    flags = dict(BLOCK_SIZE=block_size, HAS_ACTIVE=active_seqs is not None, HAS_SLOTS=seq_slots is not None,
                 QDEPTH_TENSOR=qdepth_tensor, HAS_KEY_DEPTH=key_depth is not None, DECODE_FROM_TENSOR=decode_tensor,
                 KV_FP8=kv_fp8, KV_ALIGNED=_kv_rows_aligned(k_cache))
    ml_base = t_total * h * num_ranges * d
    combine_args = (out, None, seq_lens, query_start_loc, active, ptrs[12], ptrs[14], n_seqs, h, decode_value, split,
                    num_ranges, ml_base, out.stride(0), out.stride(1))

    launches = []
    if tile_rows:
        cfg = _tile_shape(h, kvh, d, q.dtype, few_queries=t_total <= FEW_QUERIES_PER_SEQ * n_seqs)
        programs = t_total // cfg["QPT"] + n_seqs
        launches.append((_paged_attention_kernel, _combine_kernel, programs, cfg,
                         dict(BLOCK_N=KEY_TILE, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                              EXACT_DOT=exact_dots(), WIDEN_INLINE=inline_widening())))
    if decode_rows:
        cfg = _decode_shape(h, kvh, d, kv_fp8)
        cfg["num_stages"] = DECODE_STAGES
        launches.append((_decode_attention_kernel, _decode_combine_kernel, t_total, cfg,
                         dict(WIDEN_INLINE=inline_widening())))
    pdl = pdl_launch(out)
    for kernel, combine, programs, cfg, extra in launches:
        cfg = dict(cfg)
        num_warps, num_stages = cfg.pop("num_warps"), cfg.pop("num_stages")
        split_launch = _should_split(programs * kvh, num_ranges, needed, workspace, q.device)
        if split_launch and workspace is None:
            workspace = torch.empty(needed, dtype=torch.float32, device=q.device)
        ws = workspace if workspace is not None else torch.empty(0, dtype=torch.float32, device=q.device)
        grid = (programs, kvh, num_ranges if split_launch else 1)
        if kernel is _decode_attention_kernel and split_launch:
            grid = (programs, kvh, _decode_range_programs(programs * kvh, num_ranges, q.device))
        merge_in_place = False
        if kernel is _decode_attention_kernel:
            heads_fast = DECODE_HEADS_FAST and programs <= MAX_GRID_Y
            if heads_fast:
                grid = (grid[1], grid[0], grid[2])
            small = programs * kvh <= _sm_count(q.device)  # at most one row per SM
            merge_in_place = split_launch and range_counters is not None and range_counters.numel() >= programs * kvh
            extra = dict(extra, TILES=decode_tiles(kv_fp8, small), MERGE_IN_PLACE=merge_in_place, HEADS_FAST=heads_fast,
                         counters_ptr=range_counters if merge_in_place else ws, **_rope_args(rope, q, kvh))
        kernel[grid](
            *ptrs[:4], ws, *ptrs[5:], *scalars, ml_base, int(split_launch), *strides,
            num_warps=num_warps, num_stages=num_stages, **cfg, **flags, **extra, PDL=pdl, launch_pdl=pdl,
            enable_fp_fusion=True,
        )
        if split_launch and not merge_in_place:
            combine_cfg = {k: v for k, v in cfg.items() if k not in ("BLOCK_N", "BLOCK_SIZE")}
            combine[(programs, kvh)](
                combine_args[0], ws, *combine_args[2:], num_warps=num_warps, enable_fp_fusion=True,
                HAS_ACTIVE=flags["HAS_ACTIVE"], DECODE_FROM_TENSOR=decode_tensor, KV_FP8=kv_fp8, **combine_cfg,
                PDL=pdl, launch_pdl=pdl,
            )
    return out
