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
from .sampling import STREAM_ACCEPT, STREAM_RECOVER, STREAM_SAMPLE, philox_uniform


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
