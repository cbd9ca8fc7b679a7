"""Sampling kernels (`rlt_kernels.sampling`) against their torch references.

CPU: the Triton interpreter at small vocabularies (the search passes are slow there, so the
distribution tests of the top-k / top-p kernels run on the GPU only; their CPU twins check the
reference, which the kernel matches token for token). `gpu` tests add the model vocabularies
(49,152 and 65,536), many more draws and CUDA-graph capture.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlt_kernels import sampling
from rlt_kernels._triton import tl, triton

from checks import chi_square_pvalue

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
KINDS = ("greedy", "temperature", "top_k", "top_p", "min_p", "combined")
PARAMS = ("temperature", "top_k", "top_p", "min_p", "seeds", "positions")


def _logits(rows, v, dtype, device, rng, ties=False):
    """Random logits; with ``ties`` small integers, so many values repeat (tie semantics)."""
    if ties:
        x = rng.integers(-3, 4, size=(rows, v)).astype(np.float32)
    else:
        x = rng.standard_normal((rows, v)).astype(np.float32) * 3
    return torch.from_numpy(x).to(device=device, dtype=dtype)


def _params(kinds, v, device, rng):
    """Per-row sampling parameters for the given row kinds (greedy rows get random filters too:
    they must be ignored)."""
    m = len(kinds)
    kinds = np.array(kinds)
    filt = lambda *names: np.isin(kinds, names) | ((kinds == "greedy") & (rng.random(m) < 0.5))  # noqa: E731
    temperature = np.where(kinds == "greedy", rng.choice([0.0, -1.0], m), rng.uniform(0.3, 2.0, m))
    top_k = np.where(filt("top_k", "combined"), rng.integers(1, v + 2, m), rng.choice([0, -1, v], m))
    top_p = np.where(filt("top_p", "combined"), rng.uniform(0.05, 0.95, m), rng.choice([1.0, 1.5], m))
    min_p = np.where(filt("min_p", "combined"), rng.uniform(0.02, 0.5, m), 0.0)
    return {
        "temperature": torch.tensor(temperature, dtype=torch.float32, device=device),
        "top_k": torch.tensor(top_k, dtype=torch.int32, device=device),
        "top_p": torch.tensor(top_p, dtype=torch.float32, device=device),
        "min_p": torch.tensor(min_p, dtype=torch.float32, device=device),
        "seeds": torch.tensor(rng.integers(-(2**62), 2**62, m), dtype=torch.int64, device=device),
        "positions": torch.tensor(rng.integers(0, 2**33, m), dtype=torch.int64, device=device),
    }


def _filters(p):
    return p["temperature"], p["top_k"], p["top_p"], p["min_p"]


def _rows(p, index):
    return {k: t[index] for k, t in p.items()}


def _random_kinds(rng, rows):
    return [KINDS[i] for i in rng.integers(0, len(KINDS), rows)]


def _active(n, device):
    return torch.tensor([n], dtype=torch.int32, device=device)


def _assert_probs_agree(probs, ref, logits, p):
    """Same kept sets and probabilities, except on top-p rows whose boundary lies within fp32
    rounding of p: the kernel sums the mass in another order than the reference's cumsum, so
    at large vocabularies a boundary token of tiny probability may fall either way."""
    differ = ((probs > 0) != (ref > 0)).any(1)
    for r in differ.nonzero().flatten().tolist():
        row = slice(r, r + 1)
        ones = torch.ones(1, device=logits.device)
        z, keep = sampling.keep_mask_reference(logits[row], p["temperature"][row], p["top_k"][row], ones, ones * 0)
        mass = torch.softmax(torch.where(keep, z, float("-inf")).sort(descending=True).values, dim=1).cumsum(1)
        top_p = float(p["top_p"][r])
        assert top_p < 1 and float((mass - top_p).abs().min()) < 1e-4, f"row {r}: kept sets differ"
    torch.testing.assert_close(probs[~differ], ref[~differ], rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------------- Philox


@triton.jit
def _uniform_kernel(seed_ptr, pos_ptr, out_ptr, n, stream, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    u = sampling.philox_uniform_tl(tl.load(seed_ptr + row), tl.load(pos_ptr + row), stream, offs)
    tl.store(out_ptr + row * n + offs, u, mask=offs < n)


def test_philox_reference_is_philox4x32_10():
    # Random123 known-answer vector: key (0, 0), counter (0, 0, 0, 0) -> first word 0x6627e8d5.
    assert sampling.philox_words([0], [0], 0, 1)[0, 0] == 0x6627E8D5


@pytest.mark.parametrize("stream", range(5))
def test_triton_uniforms_are_bitwise_the_reference(device, stream):
    seeds = [0, 1, 2**32 - 1, 2**32, 2**40 + 5, -1, -(2**63), 2**63 - 1]
    positions = [0, 1, 2**31, 2**32 + 3, 2**40, 7, 123456789, 2**33 - 1]
    n = 300
    out = torch.full((len(seeds), n), -1.0, device=device)
    _uniform_kernel[(len(seeds),)](
        torch.tensor(seeds, dtype=torch.int64, device=device), torch.tensor(positions, dtype=torch.int64, device=device),
        out, n, stream, BLOCK=512,
    )
    ref = sampling.philox_uniform(seeds, positions, stream, n)
    assert torch.equal(out.cpu(), ref)


def test_uniforms_lie_strictly_inside_the_unit_interval_on_the_23_bit_grid():
    u = sampling.philox_uniform(np.arange(64), np.arange(64) * 3, 0, 4096).double()
    assert 0 < u.min() and u.max() < 1
    grid = u * 2.0**23 - 0.5
    assert torch.equal(grid, grid.round())


# ----------------------------------------------------------------------- sample vs reference


@settings(max_examples=10)
@given(
    seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 8), v=st.sampled_from([7, 100, 257, 1000]),
    dtype=st.sampled_from(DTYPES), ties=st.booleans(),
)
def test_sample_matches_reference(device, seed, rows, v, dtype, ties):
    rng = np.random.default_rng(seed)
    logits = _logits(rows, v, dtype, device, rng, ties)
    p = _params(_random_kinds(rng, rows), v, device, rng)
    out = sampling.sample(logits, *_filters(p), p["seeds"], p["positions"], out=torch.full((rows,), -7, device=device))
    ref = sampling.sample_reference(logits, *_filters(p), p["seeds"], p["positions"])
    assert torch.equal(out, ref)


@settings(max_examples=10)
@given(
    seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 8), v=st.sampled_from([7, 100, 257, 1000]),
    dtype=st.sampled_from(DTYPES), ties=st.booleans(),
)
def test_filtered_probs_match_reference(device, seed, rows, v, dtype, ties):
    rng = np.random.default_rng(seed)
    logits = _logits(rows, v, dtype, device, rng, ties)
    p = _params(_random_kinds(rng, rows), v, device, rng)
    out = sampling.filtered_probs(logits, *_filters(p), out=torch.full((rows, v), float("nan"), device=device))
    ref = sampling.filtered_probs_reference(logits, *_filters(p))
    _assert_probs_agree(out, ref, logits, p)
    torch.testing.assert_close(out.sum(1), torch.ones(rows, device=device), rtol=0, atol=1e-5)
    greedy = p["temperature"] <= 0
    assert torch.equal(out[greedy].argmax(1), logits[greedy].float().argmax(1))
    assert torch.equal((out[greedy] == 1).sum(1), torch.ones_like(out[greedy][:, 0], dtype=torch.int64))


def test_greedy_ties_take_the_lowest_index(device):
    logits = torch.zeros(3, 50, device=device)
    logits[0, [7, 3, 40]] = 2.0
    logits[1] = -1.0
    logits[2, [49, 48]] = 1.0
    zeros = torch.zeros(3, device=device)
    filters = (zeros, zeros.int(), zeros + 1, zeros)
    keys = torch.zeros(3, dtype=torch.int64, device=device)
    assert sampling.sample(logits, *filters, keys, keys).tolist() == [3, 0, 48]
    assert sampling.filtered_probs(logits, *filters).argmax(1).tolist() == [3, 0, 48]


def test_signed_zeros_are_one_tied_value(device):
    """-0.0 == +0.0: a top-k threshold at zero keeps both (ties kept)."""
    logits = torch.tensor([[1.0, -0.0, 0.0, -1.0, 0.5]], device=device)
    one = torch.ones(1, device=device)
    filters = (one, torch.full((1,), 3, dtype=torch.int32, device=device), one, one * 0)
    kept = sampling.filtered_probs(logits, *filters) > 0
    assert kept.tolist() == [[True, True, True, False, True]]
    assert torch.equal(kept, sampling.filtered_probs_reference(logits, *filters) > 0)


def test_ties_made_by_the_temperature_division_are_kept(device):
    """Adjacent fp32 logits can divide to the same z: top-k keeps the whole tied group."""
    base = torch.tensor(1.9).view(torch.int32)
    x = (base + torch.arange(12, dtype=torch.int32)).view(torch.float32)  # 1.9 and the next 11 floats
    logits = torch.cat([x, torch.tensor([-1.0, 0.5])]).repeat(4, 1).to(device)
    temperature = torch.tensor([3.0, 3.0, 0.7, 0.3], device=device)
    top_k = torch.tensor([1, 3, 5, 2], dtype=torch.int32, device=device)
    filters = (temperature, top_k, torch.ones(4, device=device), torch.zeros(4, device=device))
    kept = sampling.filtered_probs(logits, *filters) > 0
    assert torch.equal(kept, sampling.filtered_probs_reference(logits, *filters) > 0)
    assert (kept.sum(1) > top_k).any(), "the case should contain division ties"


def test_active_rows_leave_the_rest_untouched(device):
    rng = np.random.default_rng(5)
    logits = _logits(6, 40, torch.float32, device, rng)
    p = _params(["temperature", "greedy", "top_k", "min_p", "top_p", "combined"], 40, device, rng)
    out = sampling.sample(
        logits, *_filters(p), p["seeds"], p["positions"], out=torch.full((6,), -7, device=device),
        active_rows=_active(3, device),
    )
    ref = sampling.sample_reference(logits, *_filters(p), p["seeds"], p["positions"])
    assert torch.equal(out[:3], ref[:3]) and out[3:].tolist() == [-7, -7, -7]
    probs = sampling.filtered_probs(
        logits, *_filters(p), out=torch.full((6, 40), float("nan"), device=device), active_rows=_active(3, device)
    )
    torch.testing.assert_close(probs[:3], sampling.filtered_probs_reference(logits[:3], *_filters(_rows(p, slice(3)))))
    assert torch.isnan(probs[3:]).all()
    none = sampling.sample(
        logits, *_filters(p), p["seeds"], p["positions"], out=torch.full((6,), -7, device=device),
        active_rows=_active(0, device),
    )
    assert none.tolist() == [-7] * 6


def test_model_vocabulary_greedy_and_temperature(device):
    """One full-size (49,152) row of each fast path: greedy, temperature only, min-p."""
    rng = np.random.default_rng(11)
    logits = _logits(3, 49152, torch.bfloat16, device, rng)
    p = _params(["greedy", "temperature", "min_p"], 49152, device, rng)
    out = sampling.sample(logits, *_filters(p), p["seeds"], p["positions"])
    assert torch.equal(out, sampling.sample_reference(logits, *_filters(p), p["seeds"], p["positions"]))


# -------------------------------------------------------------------------- batch invariance


@settings(max_examples=4)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(2, 6), v=st.sampled_from([33, 300]))
def test_rows_are_bitwise_batch_invariant(device, seed, rows, v):
    """A row's token and distribution are identical alone, in a batch, permuted, behind a row
    stride, and next to padding rows past the active count."""
    rng = np.random.default_rng(seed)
    logits = _logits(rows, v, torch.bfloat16, device, rng, ties=bool(seed % 2))
    p = _params(_random_kinds(rng, rows), v, device, rng)

    def run(lg, q, **kw):
        return (
            sampling.sample(lg, *_filters(q), q["seeds"], q["positions"], **kw),
            sampling.filtered_probs(lg, *_filters(q), **kw),
        )

    tokens, probs = run(logits, p)
    perm = torch.from_numpy(rng.permutation(rows)).to(device)
    tokens_perm, probs_perm = run(logits[perm], _rows(p, perm))
    assert torch.equal(tokens_perm, tokens[perm]) and torch.equal(probs_perm, probs[perm])

    pad = 3
    wide = _logits(rows + pad, v + 5, torch.bfloat16, device, rng)
    wide[:rows, :v] = logits
    junk = _params(_random_kinds(rng, pad), v, device, rng)
    padded = {k: torch.cat([p[k], junk[k]]) for k in PARAMS}
    tokens_pad, probs_pad = run(wide[:, :v], padded, active_rows=_active(rows, device))
    assert torch.equal(tokens_pad[:rows], tokens) and torch.equal(probs_pad[:rows], probs)

    i = int(rng.integers(0, rows))
    tokens_one, probs_one = run(logits[i : i + 1], _rows(p, slice(i, i + 1)))
    assert torch.equal(tokens_one, tokens[i : i + 1]) and torch.equal(probs_one, probs[i : i + 1])


# ------------------------------------------------------------------------------ randomness


def test_draws_depend_only_on_key_position_and_stream(device):
    n, v = 24, 1000
    logits = torch.zeros(n, v, device=device)
    ones = torch.ones(n, device=device)
    filters = (ones, torch.zeros(n, dtype=torch.int32, device=device), ones, ones * 0)
    seeds = torch.full((n,), 1234, dtype=torch.int64, device=device)
    positions = torch.arange(n, dtype=torch.int64, device=device)
    first = sampling.sample(logits, *filters, seeds, positions)
    assert torch.equal(sampling.sample(logits, *filters, seeds, positions), first)
    assert len(set(first.tolist())) >= n - 3, "positions should give independent draws"
    other_stream = sampling.sample(logits, *filters, seeds, positions, stream=sampling.STREAM_DRAFT)
    other_seed = sampling.sample(logits, *filters, seeds + 1, positions)
    assert (other_stream != first).sum() >= n - 3 and (other_seed != first).sum() >= n - 3


# Six tokens (two tied); each filter keeps a different set. Expected kept sets, checked by the
# test against the reference distribution: temperature all 6, top-k 4 (k=4, ties at 1.0 within),
# top-p {0, 1, 2} (cumulative 0.38, 0.60, 0.83 at p = 0.7), min-p {0, 1, 2}.
CHI_LOGITS = [1.5, 1.0, 1.0, 0.2, -0.5, -1.5]
CHI_CONFIGS = {
    "temperature": dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, kept=6),
    "top_k": dict(temperature=0.8, top_k=4, top_p=1.0, min_p=0.0, kept=4),
    "top_p": dict(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0, kept=3),
    "min_p": dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3, kept=3),
}


def _check_frequencies(sample_fn, config, draws, device):
    """Draws at positions 0..draws-1 of one key follow the reference filtered distribution."""
    c = CHI_CONFIGS[config]
    logits = torch.tensor([CHI_LOGITS] * draws, device=device)
    full = lambda value, dtype=torch.float32: torch.full((draws,), value, dtype=dtype, device=device)  # noqa: E731
    filters = (full(c["temperature"]), full(c["top_k"], torch.int32), full(c["top_p"]), full(c["min_p"]))
    probs = sampling.filtered_probs_reference(logits[:1], *(f[:1] for f in filters))[0].cpu().double().numpy()
    assert (probs > 0).sum() == c["kept"]
    tokens = sample_fn(logits, *filters, full(99, torch.int64), torch.arange(draws, device=device)).cpu().numpy()
    counts = np.bincount(tokens, minlength=len(CHI_LOGITS)).astype(np.float64)
    assert counts[probs == 0].sum() == 0, "a filtered token was drawn"
    kept = probs > 0
    assert chi_square_pvalue(counts[kept], probs[kept] / probs[kept].sum()) > 1e-3


@pytest.mark.parametrize("config", CHI_CONFIGS)
def test_reference_frequencies_match_filtered_probs(config):
    _check_frequencies(sampling.sample_reference, config, 4000, torch.device("cpu"))


@pytest.mark.parametrize(
    "config", ["temperature", "min_p"] + [pytest.param(c, marks=pytest.mark.gpu) for c in ("top_k", "top_p")]
)
def test_kernel_frequencies_match_filtered_probs(device, config):
    """The interpreter affords 200 draws of the max-pass paths (the top-k / top-p searches
    take seconds per hundred rows there); the GPU draws 20,000 for every filter."""
    _check_frequencies(sampling.sample, config, 20000 if device.type == "cuda" else 200, device)


# -------------------------------------------------------------------------------- logprobs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_top", [0, 1, 7, 20])
def test_logprobs_match_reference(device, dtype, num_top):
    rng = np.random.default_rng(num_top)
    logits = _logits(5, 300, dtype, device, rng)
    tokens = torch.from_numpy(rng.integers(0, 300, 5)).to(device)
    chosen, ids, vals = sampling.compute_logprobs(logits, tokens, num_top)
    ref_chosen, ref_ids, ref_vals = sampling.compute_logprobs_reference(logits, tokens, num_top)
    torch.testing.assert_close(chosen, ref_chosen, rtol=1e-5, atol=1e-5)
    assert ids.shape == (5, num_top) and torch.equal(ids, ref_ids)
    torch.testing.assert_close(vals, ref_vals, rtol=1e-5, atol=1e-5)


def test_logprobs_ties_list_lowest_ids_first(device):
    rng = np.random.default_rng(3)
    logits = _logits(4, 60, torch.float32, device, rng, ties=True)
    tokens = torch.zeros(4, dtype=torch.int64, device=device)
    _, ids, vals = sampling.compute_logprobs(logits, tokens, 20)
    _, ref_ids, _ = sampling.compute_logprobs_reference(logits, tokens, 20)
    assert torch.equal(ids, ref_ids)
    for row in range(4):
        pairs = list(zip((-vals[row]).tolist(), ids[row].tolist()))
        assert pairs == sorted(pairs)


def test_logprobs_of_ids_outside_the_vocabulary_are_minus_inf(device):
    """Padded rows may carry any id (-1, unwritten memory): the kernel reads only in-range
    logits and reports -inf for such rows, like the reference."""
    rng = np.random.default_rng(5)
    logits = _logits(4, 300, torch.float32, device, rng)
    tokens = torch.tensor([-1, 300, 1 << 40, 7], dtype=torch.int64, device=device)
    chosen, ids, _ = sampling.compute_logprobs(logits, tokens, 2)
    ref_chosen, ref_ids, _ = sampling.compute_logprobs_reference(logits, tokens, 2)
    assert torch.isneginf(chosen[:3]).all() and torch.isneginf(ref_chosen[:3]).all()
    torch.testing.assert_close(chosen[3], ref_chosen[3], rtol=1e-5, atol=1e-5)
    assert torch.equal(ids, ref_ids)


def test_logprobs_reject_too_many_top_entries(device):
    logits = torch.zeros(1, 30, device=device)
    with pytest.raises(ValueError, match="num_top"):
        sampling.compute_logprobs(logits, torch.zeros(1, dtype=torch.int64, device=device), 21)


# ------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("v", [49152, 65536])
def test_gpu_model_vocabularies_match_reference(v):
    device = torch.device("cuda")
    rng = np.random.default_rng(v)
    rows = 64
    logits = _logits(rows, v, torch.bfloat16, device, rng)
    p = _params(_random_kinds(rng, rows), v, device, rng)
    out = sampling.sample(logits, *_filters(p), p["seeds"], p["positions"])
    assert torch.equal(out, sampling.sample_reference(logits, *_filters(p), p["seeds"], p["positions"]))
    probs = sampling.filtered_probs(logits, *_filters(p))
    _assert_probs_agree(probs, sampling.filtered_probs_reference(logits, *_filters(p)), logits, p)
    i = 17
    assert torch.equal(sampling.sample(logits[i : i + 1], *_filters(_rows(p, slice(i, i + 1))), p["seeds"][i : i + 1],
                                       p["positions"][i : i + 1]), out[i : i + 1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_logprobs_at_model_vocabulary(dtype):
    device = torch.device("cuda")
    rng = np.random.default_rng(9)
    logits = _logits(64, 65536, dtype, device, rng)
    tokens = torch.from_numpy(rng.integers(0, 65536, 64)).to(device)
    chosen, ids, vals = sampling.compute_logprobs(logits, tokens, 20)
    ref_chosen, ref_ids, ref_vals = sampling.compute_logprobs_reference(logits, tokens, 20)
    torch.testing.assert_close(chosen, ref_chosen, rtol=1e-5, atol=1e-5)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(vals, ref_vals, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_graph_replay_matches_eager_without_host_sync():
    device = torch.device("cuda")
    rng = np.random.default_rng(0)
    rows, v = 32, 49152
    logits = _logits(rows, v, torch.bfloat16, device, rng)
    p = _params(_random_kinds(rng, rows), v, device, rng)
    tokens = torch.empty(rows, dtype=torch.int64, device=device)
    probs = torch.empty(rows, v, device=device)
    active = _active(rows - 4, device)

    def step():
        sampling.sample(logits, *_filters(p), p["seeds"], p["positions"], out=tokens, active_rows=active)
        sampling.filtered_probs(logits, *_filters(p), out=probs, active_rows=active)

    step()  # compile outside the sync check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    eager_tokens, eager_probs = tokens.clone(), probs.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    tokens.fill_(-1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(tokens[: rows - 4], eager_tokens[: rows - 4])
    assert torch.equal(probs[: rows - 4], eager_probs[: rows - 4])
