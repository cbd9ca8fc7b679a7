"""Batched sampling with counter-based randomness.

Every random number is a pure function of (row key, position, stream, index):

    Philox4x32-10 with key (k0, k1) = (low, high 32 bits of the row key) and counter
    (c0, c1, c2, c3) = (index, position, stream, 0); the first output word x gives
    u = ((x >> 8) + 0.5) * 2**-24, uniform in (0, 1) and never 0 or 1.

The row key is derived by the runtime from (seed, request); ``position`` is the output token's
position, so a request's samples never depend on its batch neighbours, on padding or on
preemption, and replaying a CUDA graph needs no generator state. Streams keep the uses apart.

Sampling (per row; ``temperature <= 0`` means greedy argmax, lowest index on ties):
    z = logits / temperature (fp32)
    top-k  (0 < k < V): keep z >= the k-th largest z (ties kept)
    top-p  (p < 1):     over the top-k survivors, keep the smallest set of largest-probability
                        tokens whose mass reaches p (ties with its smallest member kept)
    min-p  (m > 0):     keep z >= max(z) + log(m)
    token = argmax over kept of z_i - log(-log(u_i))     (Gumbel-max; exact categorical)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ._rows import active_count

STREAM_SAMPLE = 0
STREAM_DRAFT = 1
STREAM_ACCEPT = 2
STREAM_RECOVER = 3
STREAM_STATE = 4

_PHILOX_KEY_A = np.uint32(0x9E3779B9)
_PHILOX_KEY_B = np.uint32(0xBB67AE85)
_PHILOX_ROUND_A = np.uint64(0xD2511F53)
_PHILOX_ROUND_B = np.uint64(0xCD9E8D57)
_MASK32 = np.uint64(0xFFFFFFFF)


def philox_words(seeds, positions, stream: int, indices) -> np.ndarray:
    """First Philox4x32-10 output word for every (row, index).

    seeds, positions: [M] ints; indices: [N] ints. Returns uint32 [M, N] (numpy).
    """
    seeds = np.asarray(seeds, dtype=np.int64).astype(np.uint64)
    positions = np.asarray(positions, dtype=np.int64).astype(np.uint64)
    idx = np.asarray(indices, dtype=np.int64).astype(np.uint64)
    m, n = seeds.shape[0], idx.shape[0]
    c0 = np.broadcast_to(idx[None, :], (m, n)).astype(np.uint64) & _MASK32
    c1 = np.broadcast_to((positions & _MASK32)[:, None], (m, n)).astype(np.uint64)
    c2 = np.full((m, n), np.uint64(stream) & _MASK32, dtype=np.uint64)
    c3 = np.zeros((m, n), dtype=np.uint64)
    k0 = np.broadcast_to((seeds & _MASK32)[:, None], (m, n)).astype(np.uint64)
    k1 = np.broadcast_to((seeds >> np.uint64(32))[:, None], (m, n)).astype(np.uint64)
    for _ in range(10):
        prod_b = _PHILOX_ROUND_B * c2
        prod_a = _PHILOX_ROUND_A * c0
        new_c0 = ((prod_b >> np.uint64(32)) ^ c1 ^ k0) & _MASK32
        new_c2 = ((prod_a >> np.uint64(32)) ^ c3 ^ k1) & _MASK32
        c1 = prod_b & _MASK32
        c3 = prod_a & _MASK32
        c0, c2 = new_c0, new_c2
        k0 = (k0 + np.uint64(_PHILOX_KEY_A)) & _MASK32
        k1 = (k1 + np.uint64(_PHILOX_KEY_B)) & _MASK32
    return c0.astype(np.uint32)


def philox_uniform(seeds, positions, stream: int, n: int, device=None) -> torch.Tensor:
    """Uniforms in (0, 1): fp32 [M, n] for indices 0..n-1 (see module docstring)."""
    words = philox_words(seeds, positions, stream, np.arange(n))
    u = ((words >> np.uint32(8)).astype(np.float64) + 0.5) * 2.0**-24
    return torch.from_numpy(u.astype(np.float32)).to(device)


def _to_numpy_ints(t):
    return t.detach().to("cpu", torch.int64).numpy() if isinstance(t, torch.Tensor) else np.asarray(t, np.int64)


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
    u = philox_uniform(_to_numpy_ints(seeds[:m]), _to_numpy_ints(positions[:m]), stream, logits.shape[1], logits.device)
    score = torch.where(keep, z - torch.log(-torch.log(u)), torch.full_like(z, -math.inf))
    sampled = score.argmax(1)
    greedy = logits[:m].float().argmax(1)
    out[:m] = torch.where(temperature[:m] <= 0, greedy, sampled)
    return out


def compute_logprobs_reference(logits, tokens, num_top: int = 0):
    """Raw log-probabilities (log_softmax of the unprocessed logits, fp32).

    Returns (chosen [M] fp32, top_ids [M, num_top] int64, top_logprobs [M, num_top] fp32);
    top entries are sorted by descending logprob, lowest token id first on ties.
    """
    lp = torch.log_softmax(logits.float(), dim=1)
    chosen = lp.gather(1, tokens.long()[:, None]).squeeze(1)
    if num_top <= 0:
        empty = torch.empty((logits.shape[0], 0), device=logits.device)
        return chosen, empty.long(), empty
    vals, ids = lp.topk(num_top, dim=1)
    return chosen, ids, vals
