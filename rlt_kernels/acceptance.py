"""Fused acceptance for speculative decoding: one launch per round, one program per request.

Inputs per request r (K = maximum drafts per request in the round):
    draft_tokens   [R, K] int64       drafted tokens (entries past num_drafts[r] are ignored)
    num_drafts     [R] int32          k_r in [0, K]
    target_tokens  [R, K+1] int64     the target's greedy token at each of the k_r + 1 positions
    target_probs   [R, K+1, V] fp32   processed target distribution p (sampling rows only)
    draft_probs    [R, K, V] fp32     the proposal q that drew each draft (sampling rows only)
    greedy         [R] bool           greedy rows use prefix match, others rejection sampling
    seeds, positions [R] int64        row key and the output position of the first new token

Greedy: accept drafts while draft j == target_tokens[j]; commit the accepted drafts followed
by target_tokens[accepted] (the correction, or the bonus when all pass).
Sampling (exact rejection sampling): accept draft j when u_j < min(1, p_j(y)/q_j(y)) with
u_j uniform(key, position + j, STREAM_ACCEPT, 0). On the first rejection commit a token drawn
from normalise((p_j - q_j)+) (Gumbel-max with STREAM_RECOVER at position + j; p_j itself when
the residual is empty). When all k_r drafts pass, the bonus token is drawn from p_{k_r} with
STREAM_SAMPLE at position + k_r. Rows with k_r = 0 draw only that bonus token: no draft
randomness is consumed.

Outputs: out_tokens [R, K+1] int64 (committed tokens, -1 padded), num_accepted [R] int32
(accepted drafts; committed = num_accepted + 1). Rows past ``active_rows[0]`` are not written.
"""

from __future__ import annotations

import math

import torch

from ._rows import active_count
from ._triton import check_launchable, tl, triton
from .sampling import NUM_WARPS, STREAM_ACCEPT, STREAM_RECOVER, STREAM_SAMPLE, philox_uniform, philox_uniform_tl, vocab_block
from .sampling import _argmax_of_lanes, _lane_argmax


def _gumbel_pick(probs: torch.Tensor, seed: int, position: int, stream: int) -> int:
    u = philox_uniform([seed], [position], stream, probs.shape[0], probs.device)[0]
    score = torch.where(probs > 0, torch.log(probs) - torch.log(-torch.log(u)), torch.full_like(probs, -math.inf))
    return int(score.argmax())


def accept_draft_reference(
    draft_tokens, num_drafts, target_tokens, target_probs, draft_probs, greedy, seeds, positions, *,
    out_tokens=None, num_accepted=None, active_rows=None,
):
    """Torch reference of `accept_draft` (see module docstring)."""
    r_total, k_max = draft_tokens.shape
    dev = draft_tokens.device
    out_tokens = torch.empty((r_total, k_max + 1), dtype=torch.int64, device=dev) if out_tokens is None else out_tokens
    num_accepted = torch.empty(r_total, dtype=torch.int32, device=dev) if num_accepted is None else num_accepted
    for r in range(active_count(active_rows, r_total)):
        k = int(num_drafts[r])
        committed: list[int] = []
        if bool(greedy[r]):
            acc = 0
            while acc < k and int(draft_tokens[r, acc]) == int(target_tokens[r, acc]):
                acc += 1
            committed = [int(t) for t in draft_tokens[r, :acc]] + [int(target_tokens[r, acc])]
        else:
            seed, pos = int(seeds[r]), int(positions[r])
            acc = 0
            rejected = False
            while acc < k:
                y = int(draft_tokens[r, acc])
                p = float(target_probs[r, acc, y])
                q = float(draft_probs[r, acc, y])
                u = float(philox_uniform([seed], [pos + acc], STREAM_ACCEPT, 1)[0, 0])
                if q > 0 and u < min(1.0, p / q):
                    committed.append(y)
                    acc += 1
                    continue
                residual = (target_probs[r, acc] - draft_probs[r, acc]).clamp(min=0)
                dist = residual if float(residual.sum()) > 0 else target_probs[r, acc]
                committed.append(_gumbel_pick(dist, seed, pos + acc, STREAM_RECOVER))
                rejected = True
                break
            if not rejected:
                committed.append(_gumbel_pick(target_probs[r, acc], seed, pos + acc, STREAM_SAMPLE))
        out_tokens[r] = -1
        out_tokens[r, : len(committed)] = torch.tensor(committed, dtype=torch.int64, device=dev)
        num_accepted[r] = acc
    return out_tokens, num_accepted


@triton.jit
def _gumbel_residual(p_row, q_row, q_len, V, seed, position, stream, BLOCK: tl.constexpr):
    """Gumbel-max draw from (p - q)+ with q read for indices < q_len (0 there: p itself).

    Returns (best score, token); the score is -inf when the distribution is empty.
    """
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = lanes
    for start in range(0, V, BLOCK):
        offs = start + lanes
        p = tl.load(p_row + offs, mask=offs < V, other=0.0).to(tl.float32)
        q = tl.load(q_row + offs, mask=offs < q_len, other=0.0).to(tl.float32)
        dist = tl.maximum(p - q, 0.0)
        noise = tl.log(-tl.log(philox_uniform_tl(seed, position, stream, offs)))
        score = tl.where(dist > 0.0, tl.log(tl.where(dist > 0.0, dist, 1.0)) - noise, float("-inf"))
        best, best_idx = _lane_argmax(best, best_idx, score, offs)
    return tl.max(best, axis=0), _argmax_of_lanes(best, best_idx)


@triton.jit
def _accept_kernel(
    draft_ptr, num_drafts_ptr, target_tok_ptr, target_probs_ptr, draft_probs_ptr, greedy_ptr, seed_ptr, pos_ptr,
    out_tok_ptr, num_acc_ptr, active_ptr, K, V,
    stride_draft, stride_target_tok, stride_tp_row, stride_tp_step, stride_dp_row, stride_dp_step, stride_out,
    HAS_ACTIVE: tl.constexpr, HAS_PROBS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK: tl.constexpr,
    ACCEPT: tl.constexpr, RECOVER: tl.constexpr, SAMPLE: tl.constexpr,
):
    r = tl.program_id(0)
    if HAS_ACTIVE:
        if r >= tl.load(active_ptr):
            return
    r64 = r.to(tl.int64)
    steps = tl.arange(0, BLOCK_K)
    k = tl.load(num_drafts_ptr + r).to(tl.int32)
    in_k = steps < k
    drafts = tl.load(draft_ptr + r64 * stride_draft + steps, mask=in_k, other=-1).to(tl.int64)
    seed = tl.load(seed_ptr + r).to(tl.int64)
    position = tl.load(pos_ptr + r).to(tl.int64)
    if HAS_PROBS:
        sampled = tl.load(greedy_ptr + r) == 0
    else:
        sampled = False
    if sampled:
        # Every draft's test at once: u_j < min(1, p_j(y_j) / q_j(y_j)) in fp64, as the reference.
        y = tl.where(in_k, drafts, 0)
        p = tl.load(target_probs_ptr + r64 * stride_tp_row + steps * stride_tp_step + y, mask=in_k, other=0.0)
        q = tl.load(draft_probs_ptr + r64 * stride_dp_row + steps * stride_dp_step + y, mask=in_k, other=0.0)
        u = philox_uniform_tl(seed, position + steps, ACCEPT, 0)
        ratio = tl.minimum(p.to(tl.float64) / tl.where(q > 0.0, q, 1.0).to(tl.float64), 1.0)
        passed = (q > 0.0) & (u.to(tl.float64) < ratio)
    else:
        targets = tl.load(target_tok_ptr + r64 * stride_target_tok + steps, mask=in_k, other=-1).to(tl.int64)
        passed = drafts == targets
    accepted = tl.min(tl.where(in_k & passed, BLOCK_K, steps), axis=0)
    if sampled:
        # The committed token after a rejection comes from (p - q)+, else from p (bonus); one
        # pass over V, plus a second over p only when the residual is empty.
        rejected = accepted < k
        stream = tl.where(rejected, RECOVER, SAMPLE)
        p_row = target_probs_ptr + r64 * stride_tp_row + accepted * stride_tp_step
        q_row = draft_probs_ptr + r64 * stride_dp_row + accepted * stride_dp_step
        q_len = tl.where(rejected, V, 0)
        best, final = _gumbel_residual(p_row, q_row, q_len, V, seed, position + accepted, stream, BLOCK)
        if best == float("-inf"):
            best, final = _gumbel_residual(p_row, q_row, 0, V, seed, position + accepted, stream, BLOCK)
        final = final.to(tl.int64)
    else:
        final = tl.load(target_tok_ptr + r64 * stride_target_tok + accepted).to(tl.int64)
    committed = tl.where(steps < accepted, drafts, tl.where(steps == accepted, final, -1))
    tl.store(out_tok_ptr + r64 * stride_out + steps, committed, mask=steps <= K)
    tl.store(num_acc_ptr + r, accepted)


def accept_draft(
    draft_tokens, num_drafts, target_tokens, target_probs, draft_probs, greedy, seeds, positions, *,
    out_tokens=None, num_accepted=None, active_rows=None,
):
    """Fused acceptance (Triton): one launch, one program per request; same contract as
    `accept_draft_reference` (module docstring).

    Shapes and dtypes as in the module docstring; probability tensors fp32 with a contiguous
    last dimension (other strides free). With ``target_probs=None`` every row takes the greedy
    path. The acceptance tests of all drafts are one vector step; a sampling row then makes a
    single pass over V (residual or bonus draw). No host sync, no allocation when
    ``out_tokens`` and ``num_accepted`` are given.
    """
    check_launchable(draft_tokens)
    r_total, k_max = draft_tokens.shape
    dev = draft_tokens.device
    out_tokens = torch.empty((r_total, k_max + 1), dtype=torch.int64, device=dev) if out_tokens is None else out_tokens
    num_accepted = torch.empty(r_total, dtype=torch.int32, device=dev) if num_accepted is None else num_accepted
    has_probs = target_probs is not None
    if has_probs and k_max > 0 and draft_probs is None:
        raise ValueError("draft_probs is required with target_probs when drafts exist")
    tp = target_probs if has_probs else out_tokens
    dp = draft_probs if (has_probs and k_max > 0) else tp  # q is never read without drafts
    if has_probs and (tp.stride(-1) != 1 or dp.stride(-1) != 1):
        raise ValueError("target_probs and draft_probs need a contiguous last dimension")
    v = tp.shape[-1] if has_probs else 1
    if r_total:
        _accept_kernel[(r_total,)](
            draft_tokens, num_drafts, target_tokens, tp, dp, greedy, seeds, positions, out_tokens, num_accepted,
            num_accepted if active_rows is None else active_rows, k_max, v,
            draft_tokens.stride(0), target_tokens.stride(0),
            tp.stride(0) if has_probs else 0, tp.stride(1) if has_probs else 0,
            dp.stride(0) if has_probs else 0, dp.stride(1) if has_probs else 0, out_tokens.stride(0),
            HAS_ACTIVE=active_rows is not None, HAS_PROBS=has_probs,
            BLOCK_K=triton.next_power_of_2(k_max + 1), BLOCK=vocab_block(v),
            ACCEPT=STREAM_ACCEPT, RECOVER=STREAM_RECOVER, SAMPLE=STREAM_SAMPLE, num_warps=NUM_WARPS,
            enable_fp_fusion=True,
        )
    return out_tokens, num_accepted
