"""Batched sampling with counter-based randomness.

Every random number is a pure function of (row key, position, stream, index):

    Philox4x32-10 with key (k0, k1) = (low, high 32 bits of the row key) and counter
    (c0, c1, c2, c3) = (index, position mod 2**32, stream, 0); the first output word x gives
    u = ((x >> 9) + 0.5) * 2**-23, exact in fp32, in [2**-24, 1 - 2**-24] (never 0 or 1).

The row key is derived by the runtime from (seed, request); ``position`` is the output token's
position, so a request's samples never depend on its batch neighbours, on padding or on
preemption, and replaying a CUDA graph needs no generator state. Streams keep the uses apart.

Sampling (per row; ``temperature <= 0`` means greedy argmax, lowest index on ties):
    z = logits / temperature (fp32)
    top-k  (0 < k < V): keep z >= the k-th largest z (ties kept)
    top-p  (p < 1):     over the top-k survivors, keep the smallest set of largest-probability
                        tokens whose mass reaches p (ties with its smallest member kept)
    min-p  (m > 0):     keep z - max(z) >= log(m)
    token = argmax over kept of z_i - log(-log(u_i))     (Gumbel-max; exact categorical)
"""

from __future__ import annotations

import math

import torch

from ._rows import active_count
from ._triton import check_launchable, tl, triton

STREAM_SAMPLE = 0
STREAM_DRAFT = 1
STREAM_ACCEPT = 2
STREAM_RECOVER = 3
STREAM_STATE = 4

_M32 = 0xFFFFFFFF
_PHILOX_ROUND_A, _PHILOX_ROUND_B = 0xD2511F53, 0xCD9E8D57
_PHILOX_KEY_A, _PHILOX_KEY_B = 0x9E3779B9, 0xBB67AE85


def philox_words(seeds, positions, stream: int, n: int, device=None) -> torch.Tensor:
    """First Philox4x32-10 output word for indices 0..n-1 of every row: int64 [M, n] in [0, 2**32).

    seeds, positions: [M] int64 tensors or int sequences; computed on `device` (default: the
    seeds' device) in plain torch, without host synchronisation, so it is CUDA-graph safe.
    32-bit words live in int64; products wrap modulo 2**64 and masking recovers both halves.
    """
    keys = torch.as_tensor(seeds, dtype=torch.int64, device=device)
    positions = torch.as_tensor(positions, dtype=torch.int64, device=keys.device)
    m = keys.shape[0]
    c0 = torch.arange(n, dtype=torch.int64, device=keys.device).expand(m, n)
    c1 = (positions & _M32)[:, None].expand(m, n)
    c2 = torch.full((m, n), stream & _M32, dtype=torch.int64, device=keys.device)
    c3 = torch.zeros((m, n), dtype=torch.int64, device=keys.device)
    k0, k1 = (keys & _M32)[:, None], ((keys >> 32) & _M32)[:, None]
    for _ in range(10):
        pb, pa = c2 * _PHILOX_ROUND_B, c0 * _PHILOX_ROUND_A
        c0, c1, c2, c3 = ((pb >> 32) & _M32) ^ c1 ^ k0, pb & _M32, ((pa >> 32) & _M32) ^ c3 ^ k1, pa & _M32
        k0, k1 = (k0 + _PHILOX_KEY_A) & _M32, (k1 + _PHILOX_KEY_B) & _M32
    return c0


def philox_uniform(seeds, positions, stream: int, n: int, device=None) -> torch.Tensor:
    """Uniforms in (0, 1): fp32 [M, n] for indices 0..n-1 (see module docstring and `philox_words`)."""
    return ((philox_words(seeds, positions, stream, n, device) >> 9).to(torch.float32) + 0.5) * 2.0**-23


def keep_mask_reference(logits, temperature, top_k, top_p, min_p):
    """Scaled logits z [M, V] fp32 and the boolean keep mask of the filters (module docstring)."""
    v = logits.shape[1]
    temp = temperature.float().clamp(min=1e-30)
    z = logits.float() / torch.where(temperature.float() > 0, temp, torch.ones_like(temp))[:, None]
    zs, _ = z.sort(dim=1, descending=True)
    k = top_k.long()
    k_eff = torch.where((k > 0) & (k < v), k, torch.full_like(k, v))
    kth = zs.gather(1, (k_eff - 1)[:, None])
    keep = z >= kth
    zs_kept = torch.where(zs >= kth, zs, torch.full_like(zs, -math.inf))
    ps = torch.softmax(zs_kept, dim=1)
    cs = ps.cumsum(1)
    boundary = (cs < top_p.float()[:, None]).sum(1).clamp(max=v - 1)
    tau = zs_kept.gather(1, boundary[:, None])
    keep &= torch.where((top_p < 1.0)[:, None], z >= tau, torch.ones_like(keep))
    zmax = zs[:, :1]
    mp = min_p.float()
    minp_ok = (z - zmax) >= torch.log(mp.clamp(min=1e-30))[:, None]
    keep &= torch.where((mp > 0)[:, None], minp_ok, torch.ones_like(keep))
    return z, keep


def filtered_probs_reference(logits, temperature, top_k, top_p, min_p, *, out=None, active_rows=None):
    """Processed distribution [M, V] fp32 after temperature/top-k/top-p/min-p.

    Greedy rows (temperature <= 0) get a one-hot at the argmax. Rows past the active count are
    not written.
    """
    m = active_count(active_rows, logits.shape[0])
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device) if out is None else out
    if not m:
        return out
    z, keep = keep_mask_reference(logits[:m], temperature[:m], top_k[:m], top_p[:m], min_p[:m])
    probs = torch.softmax(torch.where(keep, z, torch.full_like(z, -math.inf)), dim=1)
    greedy = temperature[:m] <= 0
    onehot = torch.zeros_like(probs).scatter_(1, logits[:m].float().argmax(1, keepdim=True), 1.0)
    out[:m] = torch.where(greedy[:, None], onehot, probs)
    return out


def sample_reference(
    logits, temperature, top_k, top_p, min_p, seeds, positions, *, stream=STREAM_SAMPLE, out=None, active_rows=None
):
    """Sample one token per row. logits [M, V] (any float dtype); per-row params [M]:
    temperature fp32, top_k int32 (<=0 off), top_p fp32 (1 off), min_p fp32 (0 off),
    seeds int64 (row keys), positions int64. Returns out [M] int64 (rows past the active count
    are not written)."""
    m = active_count(active_rows, logits.shape[0])
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device) if out is None else out
    if not m:
        return out
    z, keep = keep_mask_reference(logits[:m], temperature[:m], top_k[:m], top_p[:m], min_p[:m])
    u = philox_uniform(seeds[:m], positions[:m], stream, logits.shape[1], logits.device)
    score = torch.where(keep, z - torch.log(-torch.log(u)), torch.full_like(z, -math.inf))
    sampled = score.argmax(1)
    greedy = logits[:m].float().argmax(1)
    out[:m] = torch.where(temperature[:m] <= 0, greedy, sampled)
    return out


def compute_logprobs_reference(logits, tokens, num_top: int = 0):
    """Raw log-probabilities (log_softmax of the unprocessed logits, fp32).

    Returns (chosen [M] fp32, top_ids [M, num_top] int64, top_logprobs [M, num_top] fp32);
    top entries are sorted by descending logprob, lowest token id first on ties. A token id
    outside [0, V) gets -inf (nothing is read out of bounds).
    """
    lp = torch.log_softmax(logits.float(), dim=1)
    ids = tokens.long()
    in_range = (ids >= 0) & (ids < logits.shape[1])
    chosen = lp.gather(1, torch.where(in_range, ids, 0)[:, None]).squeeze(1)
    chosen = torch.where(in_range, chosen, torch.full_like(chosen, float("-inf")))
    if num_top <= 0:
        empty = torch.empty((logits.shape[0], 0), device=logits.device)
        return chosen, empty.long(), empty
    vals, ids = lp.sort(dim=1, descending=True, stable=True)
    return chosen, ids[:, :num_top], vals[:, :num_top]


# ---------------------------------------------------------------------------------------------
# Triton kernels: one program per row, streaming the vocabulary in chunks.
#
# Passes over a sampling row (temperature > 0) in `sample`:
#   no filter          1 pass    Gumbel-max
#   min-p only         2 passes  max, Gumbel-max
#   top-k and/or top-p 2 + at most 8 per filter: max, threshold searches, Gumbel-max
# Greedy rows make one argmax pass. Top-k and top-p thresholds are found without sorting, on
# the logits x (z = x / t is monotone in x): each search pass counts (top-k) or weighs by
# exp((x - max) / t) (top-p) the elements at or above SEARCH_CANDIDATES evenly spaced keys of
# the current key interval (keys are the fp32 bit patterns mapped to a signed-int order),
# shrinking it 16x; SEARCH_PASSES = 8 passes resolve the 32-bit key exactly, so thresholds are
# data values with tie-inclusive semantics. Random
# rows compute one Philox word and two logs per vocabulary entry: at large batches the
# temperature path is bound by that arithmetic, not by reading the logits.
# ---------------------------------------------------------------------------------------------

BLOCK_V = 2048  # vocabulary chunk of the streaming passes
SEARCH_BLOCK_V = 512  # vocabulary chunk of the search passes (holds a [chunk, candidates] tile)
SEARCH_CANDIDATES = 16
SEARCH_PASSES = 8
NUM_WARPS = 16  # 4 elements per thread at BLOCK_V: <= 64 registers, two 512-thread rows per SM


def vocab_block(v: int, block: int | None = None) -> int:
    """Chunk width for a vocabulary of v: ``block`` (default BLOCK_V), or less for tiny
    vocabularies. A function of v only, so a row's arithmetic never depends on the batch."""
    return min(BLOCK_V if block is None else block, triton.next_power_of_2(max(v, 1)))


@triton.jit
def philox_uniform_tl(seed, position, stream, index):
    """Triton twin of `philox_uniform`, bitwise equal: fp32 uniforms in (0, 1).

    seed: int64 row key (scalar); position: int64 scalar or block (taken mod 2**32); stream:
    int; index: int32 scalar or block (the vocabulary index).
    """
    word, _, _, _ = tl.random.philox(seed, index, position.to(tl.uint32), stream, 0)
    return ((word >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23


@triton.jit
def _order_key(z):
    """int32 key whose signed order is the float order of z (-0.0 and +0.0 share key 0)."""
    bits = z.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return tl.where(key == -1, 0, key)


@triton.jit
def _lane_argmax(best, best_idx, score, idx):
    """Per-lane running argmax over chunks; a lane keeps its lowest index on ties.

    Start from best = -inf and best_idx = the first chunk's indices; finish with
    `_argmax_of_lanes`. Reductions happen once per row, not once per chunk.
    """
    take = score > best
    return tl.where(take, score, best), tl.where(take, idx, best_idx)


@triton.jit
def _argmax_of_lanes(best, best_idx):
    """Row argmax from the per-lane results: the maximum, lowest index on ties."""
    top = tl.max(best, axis=0)
    return tl.min(tl.where(best == top, best_idx, 2147483647), axis=0)


@triton.jit
def _argmax_pass(row_ptr, V, BLOCK: tl.constexpr):
    """Index of the largest logit of a row (fp32 compare, lowest index on ties)."""
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = lanes
    for start in range(0, V, BLOCK):
        offs = start + lanes
        x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        best, best_idx = _lane_argmax(best, best_idx, x, offs)
    return _argmax_of_lanes(best, best_idx)


@triton.jit
def _key_value(key):
    """Inverse of `_order_key`: the fp32 value of a key."""
    return tl.where(key < 0, key ^ 0x7FFFFFFF, key).to(tl.float32, bitcast=True)


@triton.jit
def _max_pass(row_ptr, V, BLOCK: tl.constexpr):
    """Largest logit of a row (fp32)."""
    xmax = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        xmax = tl.maximum(xmax, tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32))
    return tl.max(xmax, axis=0)


@triton.jit
def _search_key(
    row_ptr, V, xmax, inv_t, floor, need,
    BY_MASS: tl.constexpr, BLOCK: tl.constexpr, CANDIDATES: tl.constexpr, PASSES: tl.constexpr,
):
    """Largest logit key T >= floor with W(T) >= need (count) or W(T) >= need * W(floor) (mass).

    W(T) sums over the elements with key >= max(T, floor) either 1 (BY_MASS False: top-k,
    need = k) or exp((x - xmax) / t) (BY_MASS True: top-p, need = p). Invariant: W(lo) passes
    and W(hi) fails. Each pass weighs CANDIDATES keys splitting [lo, hi) evenly and also snaps
    the bounds to the nearest data keys inside (W is constant between data keys), so rows with
    few distinct values in the interval finish before PASSES.
    """
    cols = tl.arange(0, CANDIDATES)
    lo = floor.to(tl.int64)
    hi = _order_key(xmax).to(tl.int64) + 1
    total = tl.full([], 0.0, tl.float32)
    for it in range(PASSES):
        if hi - lo > 1:
            cand = lo + ((hi - lo) * cols + (CANDIDATES - 1)) // CANDIDATES
            cand32 = cand.to(tl.int32)
            lo32 = lo.to(tl.int32)
            hi32 = hi.to(tl.int32)
            acc = tl.zeros([BLOCK, CANDIDATES], dtype=tl.float32)
            first_above = tl.full([BLOCK], 2147483647, tl.int32)
            last_below = tl.full([BLOCK], -2147483648, tl.int32)
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
                key = _order_key(x)
                if BY_MASS:
                    w = tl.where((offs < V) & (key >= floor), tl.exp((x - xmax) * inv_t), 0.0)
                else:
                    w = tl.where(offs < V, 1.0, 0.0)
                acc += tl.where(key[:, None] >= cand32[None, :], w[:, None], 0.0)
                first_above = tl.minimum(first_above, tl.where((offs < V) & (key >= lo32), key, 2147483647))
                last_below = tl.maximum(last_below, tl.where((offs < V) & (key < hi32), key, -2147483648))
            weight = tl.sum(acc, axis=0)
            if BY_MASS:
                # The first pass's candidate 0 is the floor itself: W(floor), the top-k mass.
                total = tl.where(it == 0, tl.sum(tl.where(cols == 0, weight, 0.0), axis=0), total)
                ok = weight >= need * total
            else:
                ok = weight >= need
            lo_next = tl.maximum(tl.max(tl.where(ok, cand, lo), axis=0), tl.min(first_above, axis=0).to(tl.int64))
            hi = tl.minimum(tl.min(tl.where(ok, hi, cand), axis=0), tl.max(last_below, axis=0).to(tl.int64) + 1)
            lo = lo_next
    return lo.to(tl.int32)


@triton.jit
def _row_filter(
    row_ptr, row, V, t, top_k_ptr, top_p_ptr, min_p_ptr, ALWAYS_MAX: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr, CANDIDATES: tl.constexpr, PASSES: tl.constexpr, BLOCK: tl.constexpr,
):
    """(zmax, z_min_kept, log_min_p) of a sampling row: keep z >= z_min_kept (top-k and top-p)
    and z - zmax >= log_min_p (min-p).

    z = x / t is monotone in the logit x, so the searches run on the logits themselves: the
    k-th largest z is the k-th largest x divided by t, ties included. Rows without filters
    skip every pass (zmax = 0, z_min_kept = log_min_p = -inf) unless ALWAYS_MAX asks for zmax.
    """
    top_k = tl.load(top_k_ptr + row).to(tl.int32)
    top_p = tl.load(top_p_ptr + row).to(tl.float32)
    min_p = tl.load(min_p_ptr + row).to(tl.float32)
    xmax = tl.full([], 0.0, tl.float32)
    zmax = tl.full([], 0.0, tl.float32)
    z_min_kept = tl.full([], float("-inf"), tl.float32)
    log_min_p = tl.full([], float("-inf"), tl.float32)
    filtered = ((top_k > 0) & (top_k < V)) | (top_p < 1.0) | (min_p > 0.0)
    if filtered | ALWAYS_MAX:
        xmax = _max_pass(row_ptr, V, BLOCK)
        zmax = tl.math.div_rn(xmax, t)
    if filtered:
        thresh = tl.full([], -2147483648, tl.int32)
        if (top_k > 0) & (top_k < V):
            thresh = _search_key(
                row_ptr, V, xmax, 1.0 / t, thresh, top_k.to(tl.float32), False, SEARCH_BLOCK, CANDIDATES, PASSES
            )
        if top_p < 1.0:
            thresh = _search_key(row_ptr, V, xmax, 1.0 / t, thresh, top_p, True, SEARCH_BLOCK, CANDIDATES, PASSES)
        if thresh > -2147483648:
            z_min_kept = tl.math.div_rn(_key_value(thresh), t)
        if min_p > 0.0:
            log_min_p = tl.log(tl.maximum(min_p, 1e-30))
    return zmax, z_min_kept, log_min_p


@triton.jit
def _kept(row_ptr, offs, V, t, zmax, z_min_kept, log_min_p):
    """Scaled logits z = logits / t of a chunk (IEEE division, as torch) and their keep mask."""
    x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    z = tl.math.div_rn(x, t)
    keep = (offs < V) & (z >= z_min_kept) & (z - zmax >= log_min_p)
    return z, keep


@triton.jit
def _sample_kernel(
    logits_ptr, stride_row, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, pos_ptr, out_ptr,
    active_ptr, V, stream,
    HAS_ACTIVE: tl.constexpr, BLOCK: tl.constexpr, SEARCH_BLOCK: tl.constexpr,
    CANDIDATES: tl.constexpr, PASSES: tl.constexpr,
):
    row = tl.program_id(0)
    if HAS_ACTIVE:
        if row >= tl.load(active_ptr):
            return
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    temperature = tl.load(temp_ptr + row).to(tl.float32)
    if temperature <= 0.0:
        token = _argmax_pass(row_ptr, V, BLOCK)
    else:
        t = tl.maximum(temperature, 1e-30)
        zmax, z_min_kept, log_min_p = _row_filter(
            row_ptr, row, V, t, top_k_ptr, top_p_ptr, min_p_ptr, False, SEARCH_BLOCK, CANDIDATES, PASSES, BLOCK
        )
        seed = tl.load(seed_ptr + row).to(tl.int64)
        position = tl.load(pos_ptr + row).to(tl.int64)
        lanes = tl.arange(0, BLOCK)
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        best_idx = lanes
        for start in range(0, V, BLOCK):
            offs = start + lanes
            z, keep = _kept(row_ptr, offs, V, t, zmax, z_min_kept, log_min_p)
            u = philox_uniform_tl(seed, position, stream, offs)
            score = tl.where(keep, z - tl.log(-tl.log(u)), float("-inf"))
            best, best_idx = _lane_argmax(best, best_idx, score, offs)
        token = _argmax_of_lanes(best, best_idx)
    tl.store(out_ptr + row, token.to(tl.int64))


@triton.jit
def _filtered_probs_kernel(
    logits_ptr, stride_row, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, out_ptr, stride_out,
    active_ptr, V,
    HAS_ACTIVE: tl.constexpr, BLOCK: tl.constexpr, SEARCH_BLOCK: tl.constexpr,
    CANDIDATES: tl.constexpr, PASSES: tl.constexpr,
):
    row = tl.program_id(0)
    if HAS_ACTIVE:
        if row >= tl.load(active_ptr):
            return
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    out_row = out_ptr + row.to(tl.int64) * stride_out
    temperature = tl.load(temp_ptr + row).to(tl.float32)
    if temperature <= 0.0:
        best_idx = _argmax_pass(row_ptr, V, BLOCK)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(out_row + offs, tl.where(offs == best_idx, 1.0, 0.0), mask=offs < V)
    else:
        t = tl.maximum(temperature, 1e-30)
        zmax, z_min_kept, log_min_p = _row_filter(
            row_ptr, row, V, t, top_k_ptr, top_p_ptr, min_p_ptr, True, SEARCH_BLOCK, CANDIDATES, PASSES, BLOCK
        )
        lane_total = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z, keep = _kept(row_ptr, offs, V, t, zmax, z_min_kept, log_min_p)
            lane_total += tl.where(keep, tl.exp(z - zmax), 0.0)
        total = tl.sum(lane_total, axis=0)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z, keep = _kept(row_ptr, offs, V, t, zmax, z_min_kept, log_min_p)
            tl.store(out_row + offs, tl.math.div_rn(tl.where(keep, tl.exp(z - zmax), 0.0), total), mask=offs < V)


@triton.jit
def _logprobs_kernel(
    logits_ptr, stride_row, tokens_ptr, chosen_ptr, ids_ptr, vals_ptr, stride_top, V,
    NUM_TOP: tl.constexpr, TOP_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    # log-sum-exp with a running maximum
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        m_next = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_next) + tl.sum(tl.exp(x - m_next), axis=0)
        m = m_next
    log_s = tl.log(s)
    token = tl.load(tokens_ptr + row).to(tl.int64)
    in_range = (token >= 0) & (token < V)  # an id outside the vocabulary reads nothing: -inf
    x_tok = tl.load(row_ptr + tl.where(in_range, token, 0)).to(tl.float32)
    tl.store(chosen_ptr + row, tl.where(in_range, (x_tok - m) - log_s, float("-inf")))
    if NUM_TOP > 0:
        # Running top list of unique rank keys (key(x) + 1) * 2**32 - 1 - index: larger logit
        # first, lower index first on ties. Unused slots hold INT64_MAX and are never replaced.
        slots = tl.arange(0, TOP_BLOCK)
        top = tl.where(slots < NUM_TOP, tl.full([TOP_BLOCK], -9223372036854775808, tl.int64), 9223372036854775807)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
            rank_key = ((_order_key(x).to(tl.int64) + 1) << 32) - 1 - offs.to(tl.int64)
            cand = tl.where(offs < V, rank_key, -9223372036854775808)
            worst = tl.min(top, axis=0)
            best = tl.max(cand, axis=0)
            while best > worst:
                slot = tl.min(tl.where(top == worst, slots, TOP_BLOCK), axis=0)
                top = tl.where(slots == slot, best, top)
                cand = tl.where(cand == best, -9223372036854775808, cand)
                worst = tl.min(top, axis=0)
                best = tl.max(cand, axis=0)
        live = slots < NUM_TOP
        top = tl.where(live, top, -9223372036854775808)
        order = tl.sum((top[None, :] > top[:, None]).to(tl.int32), axis=1)
        ids = (((top >> 32) + 1) << 32) - 1 - top
        x = tl.load(row_ptr + ids, mask=live, other=0.0).to(tl.float32)
        dst = row.to(tl.int64) * stride_top + order
        tl.store(ids_ptr + dst, ids, mask=live)
        tl.store(vals_ptr + dst, (x - m) - log_s, mask=live)


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------


def _check_logits(logits: torch.Tensor) -> None:
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be [M, V] with a contiguous last dimension, got {tuple(logits.shape)}")


def sample(
    logits, temperature, top_k, top_p, min_p, seeds, positions, *, stream=STREAM_SAMPLE, out=None, active_rows=None
):
    """Sample one token per row (Triton); same contract as `sample_reference`.

    logits [M, V] bf16/fp16/fp32 (row stride free, last dim contiguous); temperature, top_p,
    min_p fp32 [M]; top_k int32 [M]; seeds, positions int64 [M]; out int64 [M]; active_rows
    int32 [1] on the device. One program per row; no host sync, no allocation with ``out``.
    """
    _check_logits(logits)
    check_launchable(logits)
    m, v = logits.shape
    out = torch.empty(m, dtype=torch.int64, device=logits.device) if out is None else out
    if m:
        _sample_kernel[(m,)](
            logits, logits.stride(0), temperature, top_k, top_p, min_p, seeds, positions, out,
            out if active_rows is None else active_rows, v, stream,
            HAS_ACTIVE=active_rows is not None, BLOCK=vocab_block(v), SEARCH_BLOCK=vocab_block(v, SEARCH_BLOCK_V),
            CANDIDATES=SEARCH_CANDIDATES, PASSES=SEARCH_PASSES, num_warps=NUM_WARPS, enable_fp_fusion=True,
        )
    return out


def filtered_probs(logits, temperature, top_k, top_p, min_p, *, out=None, active_rows=None):
    """Processed distribution [M, V] fp32 (Triton); same contract as `filtered_probs_reference`.

    The proposal / target tensor of speculative acceptance: softmax of z over the kept set,
    one-hot at the argmax for greedy rows. ``out`` may have any row stride (last dim
    contiguous).
    """
    _check_logits(logits)
    check_launchable(logits)
    m, v = logits.shape
    out = torch.empty((m, v), dtype=torch.float32, device=logits.device) if out is None else out
    if out.stride(1) != 1:
        raise ValueError("out must have a contiguous last dimension")
    if m:
        _filtered_probs_kernel[(m,)](
            logits, logits.stride(0), temperature, top_k, top_p, min_p, out, out.stride(0),
            out if active_rows is None else active_rows, v,
            HAS_ACTIVE=active_rows is not None, BLOCK=vocab_block(v), SEARCH_BLOCK=vocab_block(v, SEARCH_BLOCK_V),
            CANDIDATES=SEARCH_CANDIDATES, PASSES=SEARCH_PASSES, num_warps=NUM_WARPS, enable_fp_fusion=True,
        )
    return out


MAX_LOGPROBS = 20


def compute_logprobs(logits, tokens, num_top: int = 0):
    """Raw log-probabilities (Triton); same contract as `compute_logprobs_reference`.

    logits [M, V] any float dtype (last dim contiguous), tokens [M] int; num_top in
    [0, min(20, V)]. Top entries are the num_top largest logits (lowest id first on ties) in
    descending order with their log-probabilities. One program per row, two passes; allocates
    its three outputs only (graph-safe, row-invariant).
    """
    _check_logits(logits)
    check_launchable(logits)
    m, v = logits.shape
    if not 0 <= num_top <= min(MAX_LOGPROBS, v):
        raise ValueError(f"num_top must be in [0, {min(MAX_LOGPROBS, v)}], got {num_top}")
    chosen = torch.empty(m, dtype=torch.float32, device=logits.device)
    ids = torch.empty((m, num_top), dtype=torch.int64, device=logits.device)
    vals = torch.empty((m, num_top), dtype=torch.float32, device=logits.device)
    if m:
        _logprobs_kernel[(m,)](
            logits, logits.stride(0), tokens, chosen, ids, vals, num_top, v,
            NUM_TOP=num_top, TOP_BLOCK=triton.next_power_of_2(max(num_top, 1)), BLOCK=vocab_block(v), num_warps=NUM_WARPS,
            enable_fp_fusion=True,
        )
    return chosen, ids, vals
