"""Fused speculative acceptance (`rlt_kernels.acceptance`) against its torch reference and the
properties it exists for: greedy rows commit the target-argmax prefix, and exact rejection
sampling commits tokens distributed as the target p whatever the proposal q.

CPU runs the Triton interpreter at small vocabularies; `gpu` tests use R = 256, K = 4 over
the Ouro vocabulary and many more trials.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlt_kernels import acceptance, sampling

from checks import chi_square_pvalue


def _probs(shape, rng, device, sparsity=0.3):
    """Random distributions over the last dim, some entries exactly zero."""
    x = rng.standard_normal(shape) * 2
    p = np.exp(x - x.max(-1, keepdims=True))
    p *= rng.random(shape) >= sparsity
    p[..., 0] += (p.sum(-1) == 0)  # never an all-zero row
    p /= p.sum(-1, keepdims=True)
    return torch.tensor(p, dtype=torch.float32, device=device)


def _draw(q: np.ndarray, rng) -> np.ndarray:
    """One token per distribution of q [..., V] (numpy randomness, independent of Philox)."""
    flat = q.reshape(-1, q.shape[-1]).astype(np.float64)
    flat /= flat.sum(1, keepdims=True)
    return np.array([rng.choice(q.shape[-1], p=row) for row in flat]).reshape(q.shape[:-1])


def _keys(rows, device, rng):
    seeds = torch.tensor(rng.integers(-(2**62), 2**62, rows), dtype=torch.int64, device=device)
    positions = torch.tensor(rng.integers(0, 2**33, rows), dtype=torch.int64, device=device)
    return seeds, positions


def _random_round(rng, rows, k_max, v, device, greedy_frac=0.4):
    """A round mixing greedy and sampling rows; drafts mostly drawn from q, some copied from the
    target argmax (long acceptances) and some arbitrary (q(y) may be 0)."""
    target_probs = _probs((rows, k_max + 1, v), rng, device)
    draft_probs = _probs((rows, k_max, v), rng, device)
    target_tokens = target_probs.argmax(-1)
    drafts = torch.tensor(_draw(draft_probs.cpu().numpy(), rng), dtype=torch.int64, device=device).reshape(rows, k_max)
    style = rng.integers(0, 3, rows)
    drafts[style == 1] = target_tokens[style == 1, :k_max]
    drafts[style == 2] = torch.tensor(rng.integers(0, v, (int((style == 2).sum()), k_max)), device=device)
    num_drafts = torch.tensor(rng.integers(0, k_max + 1, rows), dtype=torch.int32, device=device)
    greedy = torch.tensor(rng.random(rows) < greedy_frac, device=device)
    return drafts, num_drafts, target_tokens, target_probs, draft_probs, greedy, *_keys(rows, device, rng)


def _poisoned(rows, k_max, device):
    return {
        "out_tokens": torch.full((rows, k_max + 1), -7, dtype=torch.int64, device=device),
        "num_accepted": torch.full((rows,), -5, dtype=torch.int32, device=device),
    }


# ---------------------------------------------------------------------------------- greedy


@settings(max_examples=10)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 8), k_max=st.integers(0, 5))
def test_greedy_commits_the_target_argmax_prefix(device, seed, rows, k_max):
    rng = np.random.default_rng(seed)
    v = 50
    target_tokens = torch.tensor(rng.integers(0, v, (rows, k_max + 1)), device=device)
    drafts = target_tokens[:, :k_max].clone()
    mismatch = rng.integers(0, k_max + 2, rows)  # first wrong draft; > k_max - 1: none
    for r in range(rows):
        if mismatch[r] < k_max:
            drafts[r, mismatch[r]] = (target_tokens[r, mismatch[r]] + 1) % v
            drafts[r, mismatch[r] + 1 :] = torch.tensor(rng.integers(0, v, k_max - mismatch[r] - 1), device=device)
    num_drafts = torch.tensor(rng.integers(0, k_max + 1, rows), dtype=torch.int32, device=device)
    greedy = torch.ones(rows, dtype=torch.bool, device=device)
    seeds, positions = _keys(rows, device, rng)
    args = (drafts, num_drafts, target_tokens, None, None, greedy, seeds, positions)
    out, acc = acceptance.accept_draft(*args, **_poisoned(rows, k_max, device))
    for r in range(rows):
        n = min(int(mismatch[r]), int(num_drafts[r]))
        assert int(acc[r]) == n
        assert out[r].tolist() == target_tokens[r, : n + 1].tolist() + [-1] * (k_max - n)
    ref_out, ref_acc = acceptance.accept_draft_reference(*args)
    assert torch.equal(out, ref_out) and torch.equal(acc, ref_acc)


# ------------------------------------------------------------------------ kernel == reference


@settings(max_examples=10)
@given(
    seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 6), k_max=st.integers(0, 4),
    v=st.sampled_from([5, 37, 300]),
)
def test_kernel_matches_reference_exactly(device, seed, rows, k_max, v):
    rng = np.random.default_rng(seed)
    args = _random_round(rng, rows, k_max, v, device)
    out, acc = acceptance.accept_draft(*args, **_poisoned(rows, k_max, device))
    ref_out, ref_acc = acceptance.accept_draft_reference(*args)
    assert torch.equal(out, ref_out) and torch.equal(acc, ref_acc)


def test_empty_residual_falls_back_to_the_target(device):
    """A draft with q(y) = 0 is rejected; with p == q the residual is empty and the committed
    token comes from p itself (STREAM_RECOVER noise)."""
    rng = np.random.default_rng(4)
    rows, v = 6, 20
    p = _probs((rows, 2, v), rng, device, sparsity=0.5)
    drafts = torch.stack([(p[r, 0] == 0).nonzero()[0] for r in range(rows)])  # q(y) = 0
    args = (
        drafts, torch.ones(rows, dtype=torch.int32, device=device), p.argmax(-1), p, p[:, :1].clone(),
        torch.zeros(rows, dtype=torch.bool, device=device), *_keys(rows, device, rng),
    )
    out, acc = acceptance.accept_draft(*args)
    assert acc.tolist() == [0] * rows
    assert bool((p[torch.arange(rows), 0, out[:, 0]] > 0).all())
    ref_out, _ = acceptance.accept_draft_reference(*args)
    assert torch.equal(out, ref_out)


def test_zero_draft_rows_draw_the_bonus_like_sampling(device):
    """k_r = 0 consumes no draft randomness: the bonus is the sampler's draw at that position."""
    rng = np.random.default_rng(8)
    rows, v = 8, 50
    p = _probs((rows, 1, v), rng, device, sparsity=0.0)
    seeds, positions = _keys(rows, device, rng)
    out, acc = acceptance.accept_draft(
        torch.empty((rows, 0), dtype=torch.int64, device=device), torch.zeros(rows, dtype=torch.int32, device=device),
        p.argmax(-1), p, None, torch.zeros(rows, dtype=torch.bool, device=device), seeds, positions,
    )
    ones = torch.ones(rows, device=device)
    sampled = sampling.sample(
        torch.log(p[:, 0]), ones, torch.zeros(rows, dtype=torch.int32, device=device), ones, ones * 0, seeds, positions
    )
    assert acc.tolist() == [0] * rows and torch.equal(out[:, 0], sampled)


def test_active_rows_leave_the_rest_untouched(device):
    rng = np.random.default_rng(2)
    rows, k_max, v = 5, 3, 30
    args = _random_round(rng, rows, k_max, v, device)
    out, acc = acceptance.accept_draft(*args, **_poisoned(rows, k_max, device), active_rows=torch.tensor(
        [2], dtype=torch.int32, device=device))
    ref_out, ref_acc = acceptance.accept_draft_reference(*args)
    assert torch.equal(out[:2], ref_out[:2]) and torch.equal(acc[:2], ref_acc[:2])
    assert (out[2:] == -7).all() and (acc[2:] == -5).all()


def test_rows_are_batch_invariant(device):
    rng = np.random.default_rng(6)
    rows, k_max, v = 6, 3, 40
    args = _random_round(rng, rows, k_max, v, device)
    out, acc = acceptance.accept_draft(*args)
    perm = torch.from_numpy(rng.permutation(rows)).to(device)
    out_p, acc_p = acceptance.accept_draft(*(a[perm] for a in args))
    assert torch.equal(out_p, out[perm]) and torch.equal(acc_p, acc[perm])
    out_1, acc_1 = acceptance.accept_draft(*(a[3:4] for a in args))
    assert torch.equal(out_1, out[3:4]) and torch.equal(acc_1, acc[3:4])


# ------------------------------------------------------------------- distribution preserved


# Target and proposal disagree everywhere: token 3 has p = 0 (never committed), token 4 has
# q = 0 (committed only through the residual).
P0 = np.array([0.4, 0.3, 0.2, 0.0, 0.1])
Q0 = np.array([0.1, 0.2, 0.3, 0.4, 0.0])


@pytest.mark.parametrize("impl", ["kernel", "reference"])
def test_rejection_sampling_commits_target_distributed_tokens(device, impl):
    """Drafts drawn from q; the first committed token must follow p. The interpreter affords
    300 kernel trials, the reference 3000 (the kernel matches it exactly), the GPU 20000."""
    accept = acceptance.accept_draft if impl == "kernel" else acceptance.accept_draft_reference
    if impl == "reference":
        trials = 3000
    else:
        trials = 20000 if device.type == "cuda" else 300
    k_max = 2
    rng = np.random.default_rng(0)
    target = torch.tensor(np.tile(P0, (trials, k_max + 1, 1)), dtype=torch.float32, device=device)
    proposal = torch.tensor(np.tile(Q0, (trials, k_max, 1)), dtype=torch.float32, device=device)
    drafts = torch.tensor(rng.choice(5, size=(trials, k_max), p=Q0), device=device)
    out, acc = accept(
        drafts, torch.full((trials,), k_max, dtype=torch.int32, device=device), target.argmax(-1), target, proposal,
        torch.zeros(trials, dtype=torch.bool, device=device), torch.full((trials,), 5, dtype=torch.int64, device=device),
        torch.arange(trials, dtype=torch.int64, device=device) * (k_max + 1),
    )
    first = np.bincount(out[:, 0].cpu().numpy(), minlength=5).astype(np.float64)
    assert first[3] == 0
    kept = P0 > 0
    assert chi_square_pvalue(first[kept], P0[kept]) > 1e-3
    # The first draft passes with probability sum(min(p, q)) = 0.6.
    overlap = np.minimum(P0, Q0).sum()
    passed = float((acc >= 1).float().mean())
    assert abs(passed - overlap) < 4 * math.sqrt(overlap * (1 - overlap) / trials)


# ------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [64, 256])
def test_gpu_ouro_vocabulary_matches_reference(rows):
    device = torch.device("cuda")
    rng = np.random.default_rng(rows)
    args = _random_round(rng, rows, 4, 49152, device)
    out, acc = acceptance.accept_draft(*args)
    ref_out, ref_acc = acceptance.accept_draft_reference(*args)
    assert torch.equal(out, ref_out) and torch.equal(acc, ref_acc)


@pytest.mark.gpu
def test_gpu_graph_replay_matches_eager_without_host_sync():
    device = torch.device("cuda")
    rng = np.random.default_rng(1)
    rows, k_max = 64, 4
    args = _random_round(rng, rows, k_max, 49152, device)
    bufs = _poisoned(rows, k_max, device)
    acceptance.accept_draft(*args, **bufs)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        acceptance.accept_draft(*args, **bufs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    eager = (bufs["out_tokens"].clone(), bufs["num_accepted"].clone())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        acceptance.accept_draft(*args, **bufs)
    bufs["out_tokens"].fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bufs["out_tokens"], eager[0]) and torch.equal(bufs["num_accepted"], eager[1])
