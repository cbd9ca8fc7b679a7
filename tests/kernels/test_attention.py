"""Paged attention: the Triton kernel against the torch reference and an fp64 softmax written
here, poisoned outputs and caches, loop-depth plane maps, and bitwise batch invariance."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlt_kernels import attention as attn
from rlt_kernels.attention import (
    DEFAULT_SPLIT_SIZE,
    attention_workspace_size,
    new_attention_workspace,
    new_range_counters,
    paged_attention,
    paged_attention_reference,
)

TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}

# Plane maps of docs/design.md: (planes, plane_offset, plane_modulus, loop depth D).
PLANE_MAPS = {
    "plain": (1, 0, None, 1),
    "last_exited": (4, 0, None, 4),
    "shared": (1, 0, 1, 4),
    "huginn": (1 + 6, 1, None, 6),
    "huginn_compress": (1 + 2, 1, 2, 8),
}


@dataclass
class Batch:
    """A paged batch: every sequence owns its own blocks (per plane) of one shared cache."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    kwargs: dict = field(default_factory=dict)

    def args(self):
        return self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens, self.query_start_loc


def make_batch(seqs, *, heads=2, kv_heads=1, head_dim=64, block_size=16, dtype=torch.float32,
               device="cpu", plane_map="plain", pad_tokens=0, spare_rows=0, active=None, seed=0,
               depth_as_int=False):
    """seqs: list of (q_len, seq_len). Unused cache blocks, the tails of partly used blocks,
    unused table entries, metadata past the active count and the output are all poisoned."""
    gen = torch.Generator().manual_seed(seed)
    planes, offset, modulus, depth = PLANE_MAPS[plane_map]
    n = len(seqs)
    rows = n + spare_rows
    blocks_per_seq = [-(-s // block_size) for _, s in seqs]
    max_blocks = max(blocks_per_seq + [0]) + 1
    num_blocks = planes * sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.randint(0, num_blocks, (planes, rows, max_blocks), generator=gen, dtype=torch.int32)
    tables[:, :, -1] = -1
    slots = torch.randperm(rows, generator=gen)[:n] if spare_rows else torch.arange(n)
    k = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"))
    v = torch.full_like(k, float("nan"))
    used = 0
    for (_, seq_len), nb, slot in zip(seqs, blocks_per_seq, slots.tolist()):
        for p in range(planes):
            ids = perm[used: used + nb]
            used += nb
            tables[p, slot, :nb] = ids.int()
            for j, b in enumerate(ids.tolist()):
                live = min(block_size, seq_len - j * block_size)
                k[b, :live] = torch.randn(live, kv_heads, head_dim, generator=gen)
                v[b, :live] = torch.randn(live, kv_heads, head_dim, generator=gen)
    q_lens = torch.tensor([ql for ql, _ in seqs], dtype=torch.int32)
    total = int(q_lens.sum())
    qsl = torch.zeros(n + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_lens, 0)
    seq_lens = torch.tensor([s for _, s in seqs], dtype=torch.int32)
    kwargs = {}
    if active is not None:
        kwargs["active_seqs"] = torch.tensor([active], dtype=torch.int32, device=device)
        seq_lens[active:] = 10**6  # never read: past the active count
        qsl[active + 1:] = -7
    if spare_rows:
        kwargs["seq_slots"] = slots.int().to(device)
    if plane_map != "plain":
        kwargs.update(plane_offset=offset, plane_modulus=modulus,
                      key_depth=torch.randint(0, depth, (num_blocks, block_size), generator=gen,
                                              dtype=torch.int32).to(device))
        if depth_as_int:
            kwargs["query_depth"] = int(torch.randint(0, depth, (1,), generator=gen))
        else:
            kwargs["query_depth"] = torch.randint(0, depth, (n,), generator=gen, dtype=torch.int32).to(device)
    q = torch.randn(total + pad_tokens, heads, head_dim, generator=gen)
    return Batch(
        q.to(dtype).to(device), k.to(dtype).to(device), v.to(dtype).to(device),
        (tables if planes > 1 or plane_map != "plain" else tables[0]).to(device),
        seq_lens.to(device), qsl.to(device), kwargs,
    )


def fp64_attention(b: Batch, scale=None):
    """Per-query softmax in fp64, written independently of the reference. Returns
    {token: [H, D]} for every token an active sequence owns."""
    q, kc, vc = b.q.double().cpu(), b.k_cache.double().cpu(), b.v_cache.double().cpu()
    tables = b.block_tables.cpu()
    tables = tables if tables.dim() == 3 else tables[None]
    h, d = q.shape[1:]
    bs, kvh = kc.shape[1], kc.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    kw = b.kwargs
    n = b.seq_lens.shape[0]
    if "active_seqs" in kw:
        n = min(n, int(kw["active_seqs"][0]))
    offset = kw.get("plane_offset", 0)
    modulus = kw.get("plane_modulus") or tables.shape[0] - offset
    qd_all = kw.get("query_depth", 0)
    key_depth = kw["key_depth"].cpu() if "key_depth" in kw else None
    result = {}
    for s in range(n):
        slot = int(kw["seq_slots"][s]) if "seq_slots" in kw else s
        start, end = int(b.query_start_loc[s]), int(b.query_start_loc[s + 1])
        seq_len = int(b.seq_lens[s])
        qd = int(qd_all[s]) if isinstance(qd_all, torch.Tensor) else qd_all
        keys, vals = [], []
        for j in range(seq_len):
            logical, off = divmod(j, bs)
            depth = qd if key_depth is None else min(qd, int(key_depth[tables[0, slot, logical], off]))
            blk = tables[offset + depth % modulus, slot, logical]
            keys.append(kc[blk, off])
            vals.append(vc[blk, off])
        for i in range(end - start):
            pos = seq_len - (end - start) + i
            if seq_len == 0:
                result[start + i] = torch.zeros(h, d, dtype=torch.float64)
                continue
            kk = torch.stack(keys[: pos + 1]).repeat_interleave(h // kvh, dim=1)  # [keys, H, D]
            vv = torch.stack(vals[: pos + 1]).repeat_interleave(h // kvh, dim=1)
            w = torch.softmax(torch.einsum("hd,khd->hk", q[start + i], kk) * scale, dim=-1)
            result[start + i] = torch.einsum("hk,khd->hd", w, vv)
    return result


def check_against_oracle(out, b: Batch, dtype, scale=None):
    """Owned rows match the fp64 softmax; every other row is still the NaN poison."""
    expected = fp64_attention(b, scale)
    out = out.double().cpu()
    tol = TOL[dtype]
    for t in range(out.shape[0]):
        if t in expected:
            torch.testing.assert_close(out[t], expected[t], atol=tol, rtol=tol, msg=f"token {t}")
        else:
            assert torch.isnan(out[t]).all(), f"row {t} is owned by no active sequence but was written"


def poisoned(b: Batch):
    return torch.full_like(b.q, float("nan"))


def run_kernel(b: Batch, **extra):
    return paged_attention(*b.args(), out=poisoned(b), **{**b.kwargs, **extra})


def run_reference(b: Batch, **extra):
    return paged_attention_reference(*b.args(), out=poisoned(b), **{**b.kwargs, **extra})


def assert_same_bits(a, b):
    assert torch.equal(a.view(torch.int16) if a.element_size() == 2 else a.view(torch.int32),
                       b.view(torch.int16) if b.element_size() == 2 else b.view(torch.int32))


def with_decode_rows(b: Batch, mode: str, seed: int) -> Batch:
    """Give `b` a decode_from: "none" (tile arithmetic only), "all" (0: decode arithmetic only)
    or "some" (a random first decode position per sequence, as for a recomputed output)."""
    if mode == "all":
        b.kwargs["decode_from"] = 0
    elif mode == "some":
        gen = torch.Generator().manual_seed(seed)
        bound = b.seq_lens.cpu().clamp(0, 10**4) + 2
        b.kwargs["decode_from"] = (torch.rand(bound.shape, generator=gen) * bound).int().to(b.q.device)
    return b


DECODE_MODES = st.sampled_from(["none", "all", "some"])


# ---------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------

def seq_strategy(max_prefill=70, max_context=150):
    """(q_len, seq_len): decode, speculative verify, prefill chunk, or an inert padded row."""
    decode = st.integers(1, max_context).map(lambda s: (1, s))
    verify = st.tuples(st.integers(2, 5), st.integers(0, max_context)).map(lambda t: (t[0], t[0] + t[1]))
    prefill = st.tuples(st.integers(6, max_prefill), st.integers(0, 60)).map(lambda t: (t[0], t[0] + t[1]))
    inert = st.sampled_from([(0, 0), (1, 0)])
    return st.one_of(decode, verify, prefill, inert)


# ---------------------------------------------------------------------------------------------
# Reference and kernel against the fp64 oracle
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_reference_matches_fp64(head_dim, group):
    b = make_batch([(1, 37), (3, 20), (0, 0), (1, 0), (17, 17)], heads=2 * group, kv_heads=2,
                   head_dim=head_dim, pad_tokens=2, seed=head_dim + group)
    check_against_oracle(run_reference(b), b, torch.float32)


@settings(max_examples=10)
@given(
    seqs=st.lists(seq_strategy(), min_size=1, max_size=4),
    group=st.sampled_from([1, 2, 4]),
    kv_heads=st.sampled_from([1, 2]),
    head_dim=st.sampled_from([64, 128]),
    block_size=st.sampled_from([16, 64]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    pad_tokens=st.integers(0, 3),
    spare_rows=st.integers(0, 2),
    active_drop=st.integers(0, 2),
    decode=DECODE_MODES,
    seed=st.integers(0, 2**16),
)
def test_kernel_matches_reference_and_fp64(device, seqs, group, kv_heads, head_dim, block_size, dtype,
                                           pad_tokens, spare_rows, active_drop, decode, seed):
    active = max(0, len(seqs) - active_drop) if active_drop else None
    b = make_batch(seqs, heads=group * kv_heads, kv_heads=kv_heads, head_dim=head_dim,
                   block_size=block_size, dtype=dtype, device=device, pad_tokens=pad_tokens,
                   spare_rows=spare_rows, active=active, seed=seed)
    with_decode_rows(b, decode, seed)
    got = run_kernel(b)
    check_against_oracle(got, b, dtype)
    ref = run_reference(b)
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    tol = TOL[dtype]
    torch.testing.assert_close(got.nan_to_num(7.0), ref.nan_to_num(7.0), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_huginn_head_dim_96(device, dtype):
    b = make_batch([(1, 45), (4, 70), (9, 9)], heads=3, kv_heads=3, head_dim=96, block_size=16,
                   dtype=dtype, device=device, plane_map="huginn", seed=3)
    check_against_oracle(run_kernel(b), b, dtype)


def test_custom_scale(device):
    b = make_batch([(2, 30), (1, 64)], heads=2, kv_heads=1, device=device, seed=5)
    check_against_oracle(run_kernel(b, scale=0.3), b, torch.float32, scale=0.3)


@settings(max_examples=8)
@given(
    plane_map=st.sampled_from(["last_exited", "shared", "huginn", "huginn_compress"]),
    seqs=st.lists(seq_strategy(max_prefill=20, max_context=90), min_size=1, max_size=3),
    block_size=st.sampled_from([16, 32]),
    depth_as_int=st.booleans(),
    decode=DECODE_MODES,
    seed=st.integers(0, 2**16),
)
def test_depth_aware_plane_maps(device, plane_map, seqs, block_size, depth_as_int, decode, seed):
    b = make_batch(seqs, heads=2, kv_heads=1, block_size=block_size, device=device, plane_map=plane_map,
                   depth_as_int=depth_as_int, seed=seed)
    with_decode_rows(b, decode, seed)
    got = run_kernel(b)
    check_against_oracle(got, b, torch.float32)
    torch.testing.assert_close(got.nan_to_num(7.0), run_reference(b).nan_to_num(7.0), atol=2e-5, rtol=2e-5)


def test_query_depth_without_key_depth_reads_own_plane(device):
    b = make_batch([(2, 40), (1, 19)], heads=2, kv_heads=1, device=device, plane_map="last_exited", seed=9)
    del b.kwargs["key_depth"]
    got = run_kernel(b)
    check_against_oracle(got, b, torch.float32)


# ---------------------------------------------------------------------------------------------
# Batch invariance (bitwise)
# ---------------------------------------------------------------------------------------------

def sub_batch(universe: Batch, order, pad_seqs=0, pad_tokens=0):
    """The sequences `order` of `universe` (same cache and tables), optionally followed by inert
    padded sequences (seq_len 0, one query) and padding tokens. Returns (batch, token map)."""
    qsl = universe.query_start_loc.cpu()
    spans = [(int(qsl[s]), int(qsl[s + 1])) for s in order]
    tokens = [t for a, e in spans for t in range(a, e)]
    q = universe.q[tokens] if tokens else universe.q[:0]
    h, d = universe.q.shape[1:]
    q = torch.cat([q, torch.randn(pad_seqs + pad_tokens, h, d).to(q)])
    q_lens = [e - a for a, e in spans] + [1] * pad_seqs
    new_qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    new_qsl[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0)
    seq_lens = torch.cat([universe.seq_lens.cpu()[list(order)], torch.zeros(pad_seqs, dtype=torch.int32)])
    rows = list(order) + [0] * pad_seqs
    kwargs = dict(universe.kwargs)
    kwargs["seq_slots"] = torch.tensor(rows, dtype=torch.int32)
    for name in ("query_depth", "decode_from"):
        if isinstance(kwargs.get(name), torch.Tensor):
            kwargs[name] = torch.cat([kwargs[name].cpu()[list(order)], torch.zeros(pad_seqs, dtype=torch.int32)])
    dev = universe.q.device
    kwargs = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    b = Batch(q, universe.k_cache, universe.v_cache, universe.block_tables, seq_lens.to(dev),
              new_qsl.to(dev), kwargs)
    return b, dict(zip(tokens, range(len(tokens))))


@settings(max_examples=3)
@given(
    seqs=st.lists(seq_strategy(max_prefill=70, max_context=140), min_size=2, max_size=4),
    group=st.sampled_from([1, 2, 4]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    plane_map=st.sampled_from(["plain", "last_exited"]),
    decode=DECODE_MODES,
    data=st.data(),
)
def test_batch_invariance_bitwise(device, seqs, group, dtype, plane_map, decode, data):
    seed = data.draw(st.integers(0, 2**16))
    universe = make_batch(seqs, heads=group, kv_heads=1, dtype=dtype, device=device, plane_map=plane_map, seed=seed)
    with_decode_rows(universe, decode, seed)
    n = len(seqs)
    alone = {}
    for s in range(n):
        b, tokens = sub_batch(universe, [s])
        out = run_kernel(b)
        alone.update({t: out[i] for t, i in tokens.items()})
    order = data.draw(st.permutations(range(n)))
    pad_seqs, pad_tokens = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))
    b, tokens = sub_batch(universe, order, pad_seqs=pad_seqs, pad_tokens=pad_tokens)
    out = run_kernel(b)
    for t, i in tokens.items():
        assert_same_bits(out[i], alone[t])
    n_real = len(tokens)
    assert (out[n_real: n_real + pad_seqs] == 0).all()  # inert padded sequences give zeros
    assert torch.isnan(out[n_real + pad_seqs:]).all()  # padding tokens owned by nobody


@settings(max_examples=6)
@given(
    context=st.integers(1, 200),
    verify_len=st.integers(2, 6),
    prefill_len=st.integers(65, 140),
    group=st.sampled_from([1, 2, 4]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    data=st.data(),
)
def test_decode_verify_prefill_same_bits(device, context, verify_len, prefill_len, group, dtype, data):
    """The tile arithmetic: one query position computed alone, inside a verify tile and inside a
    prefill tile (at a different row of a later query tile) gives identical bits."""
    seq_len = context + prefill_len
    universe = make_batch([(prefill_len, seq_len)], heads=group, kv_heads=1, dtype=dtype, device=device,
                          seed=data.draw(st.integers(0, 2**16)))
    prefill_out = run_kernel(universe)
    pos = context + data.draw(st.integers(verify_len - 1, prefill_len - 1))  # a key position
    query = universe.q[pos - context]

    def single_seq(q_len):  # queries ending at `pos`, our query last
        qs = torch.cat([torch.randn(q_len - 1, *query.shape).to(query), query[None]])
        qsl = torch.tensor([0, q_len], dtype=torch.int32, device=device)
        sl = torch.tensor([pos + 1], dtype=torch.int32, device=device)
        b = Batch(qs, universe.k_cache, universe.v_cache, universe.block_tables, sl, qsl)
        return run_kernel(b)[-1]

    assert_same_bits(single_seq(1), prefill_out[pos - context])
    assert_same_bits(single_seq(verify_len), prefill_out[pos - context])


@settings(max_examples=3)
@given(
    context=st.integers(0, 150),
    prefill_len=st.integers(2, 90),
    group=st.sampled_from([1, 2, 4]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    plane_map=st.sampled_from(["plain", "last_exited", "huginn"]),
    data=st.data(),
)
def test_generated_rows_same_bits_in_decode_and_recompute(device, context, prefill_len, group, dtype, plane_map,
                                                          data):
    """The decode arithmetic: a generated token's row recomputed inside a prefill chunk (rows at
    or past decode_from, beside prompt rows and other sequences) has the bits of the same row
    run as a decode step (one query per sequence, decode_from=0); the prompt rows of that chunk
    keep the tile arithmetic's bits."""
    seed = data.draw(st.integers(0, 2**16))
    seq_len = context + prefill_len
    universe = make_batch([(prefill_len, seq_len), (3, 40)], heads=group, kv_heads=1, dtype=dtype, device=device,
                          plane_map=plane_map, seed=seed)
    first_generated = context + data.draw(st.integers(0, prefill_len))
    universe.kwargs["decode_from"] = torch.tensor([first_generated, 38], dtype=torch.int32, device=device)
    recomputed = run_kernel(universe)
    tile_only = run_kernel(universe, decode_from=None)
    check_against_oracle(recomputed, universe, dtype)
    depth = universe.kwargs.get("query_depth")
    for row in range(first_generated - context):
        assert_same_bits(recomputed[row], tile_only[row])
    # Generated rows re-run one at a time as decode steps: the first, the last and up to four drawn
    # between (each re-run is a launch, which the interpreter makes costly; every row is the same check).
    generated = list(range(first_generated, seq_len))
    if generated:
        picked = data.draw(st.lists(st.sampled_from(generated), max_size=4))
        generated = sorted({generated[0], generated[-1], *picked})
    for pos in generated:
        row = pos - context
        qsl = torch.tensor([0, 1], dtype=torch.int32, device=device)
        sl = torch.tensor([pos + 1], dtype=torch.int32, device=device)
        kw = {k: v for k, v in universe.kwargs.items() if k not in ("decode_from", "query_depth")}
        if depth is not None:
            kw["query_depth"] = depth[:1]
        b = Batch(universe.q[row: row + 1], universe.k_cache, universe.v_cache, universe.block_tables, sl, qsl, kw)
        assert_same_bits(run_kernel(b, decode_from=0)[0], recomputed[row])


# ---------------------------------------------------------------------------------------------
# Split-KV
# ---------------------------------------------------------------------------------------------

@settings(max_examples=3)
@given(
    seqs=st.lists(seq_strategy(max_prefill=16, max_context=140), min_size=0, max_size=2),
    spanning=st.tuples(st.integers(2, 24), st.integers(130, 150)),
    split_size=st.sampled_from([64, 128]),
    group=st.sampled_from([1, 4]),
    head_dim=st.sampled_from([64, 96]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    decode=DECODE_MODES,
    seed=st.integers(0, 2**16),
)
def test_split_matches_unsplit_bitwise(device, monkeypatch, seqs, spanning, split_size, group, head_dim,
                                       dtype, decode, seed):
    """Split launches (auto-allocated or caller-owned workspace) give the unsplit bits. One
    multi-query sequence always spans several key ranges, so its rows end in different ranges."""
    b = make_batch(seqs + [spanning], heads=group, kv_heads=1, head_dim=head_dim, dtype=dtype,
                   device=device, spare_rows=1, pad_tokens=1, seed=seed)
    with_decode_rows(b, decode, seed)
    monkeypatch.setattr(attn, "_should_split", lambda *a: False)
    unsplit = run_kernel(b, split_size=split_size)
    monkeypatch.setattr(attn, "_should_split", lambda *a: True)
    assert_same_bits(run_kernel(b, split_size=split_size), unsplit)
    max_ctx = b.block_tables.shape[-1] * b.k_cache.shape[1]
    workspace = new_attention_workspace(b.q.shape[0], group, head_dim, max_ctx, split_size=split_size,
                                        device=device)
    workspace.fill_(1e30)  # finite garbage: partials must be written before they are read
    assert_same_bits(run_kernel(b, split_size=split_size, workspace=workspace), unsplit)
    counters = new_range_counters(device)  # decode rows merge their ranges in place: still the same bits
    for _ in range(2):
        assert_same_bits(run_kernel(b, split_size=split_size, workspace=workspace, range_counters=counters), unsplit)
    assert not counters.any(), "the last range program of a row puts its counter back to zero"
    check_against_oracle(unsplit, b, dtype)


def test_decode_ranges_merged_in_place(device, monkeypatch):
    """A split decode launch given range counters merges each row's key ranges in its last range
    program instead of the combine kernel: the bits of the combine kernel's launch, for rows of
    one range, a range boundary and several ranges, and zeros for a row that sees no key (more
    queries than keys), call after call (counters back at zero); close to the oracle."""
    monkeypatch.setattr(attn, "_should_split", lambda *a: True)
    contexts = [(1, n) for n in (1, 63, 64, 65, 130, 200)]
    for seqs in (contexts, contexts + [(3, 2)]):
        b = make_batch(seqs, heads=4, kv_heads=2, head_dim=64, dtype=torch.float32, device=device, seed=5)
        combined = run_kernel(b, decode_from=0, split_size=64)
        counters = new_range_counters(device)
        for _ in range(2):
            merged = run_kernel(b, decode_from=0, split_size=64, range_counters=counters)
            assert_same_bits(merged, combined)
            assert not counters.any()
        if len(seqs) == len(contexts):
            check_against_oracle(merged, b, torch.float32)
    assert torch.equal(merged[len(contexts)], torch.zeros_like(merged[0]))  # the row that sees no key


@pytest.mark.parametrize("range_programs", [1, 3, 64])
def test_decode_range_programs_keep_bits(device, monkeypatch, range_programs):
    """A split decode launch runs fewer range programs than key ranges (each takes every n-th
    range of its row): the unsplit bits for any count, with the combine kernel or merged in
    place, rows of one range, a range boundary and several ranges, call after call."""
    contexts = [(1, n) for n in (1, 63, 64, 65, 130, 200, 260)]
    b = make_batch(contexts, heads=2, kv_heads=2, head_dim=64, dtype=torch.float32, device=device, seed=9)
    monkeypatch.setattr(attn, "_should_split", lambda *a: False)
    unsplit = run_kernel(b, decode_from=0, split_size=64)
    monkeypatch.setattr(attn, "_should_split", lambda *a: True)
    monkeypatch.setattr(attn, "_decode_range_programs", lambda rows, num_ranges, dev: min(num_ranges, range_programs))
    assert_same_bits(run_kernel(b, decode_from=0, split_size=64), unsplit)
    counters = new_range_counters(device)
    for _ in range(2):
        assert_same_bits(run_kernel(b, decode_from=0, split_size=64, range_counters=counters), unsplit)
        assert not counters.any()
    check_against_oracle(unsplit, b, torch.float32)


def test_decode_range_programs_rule(monkeypatch):
    """Enough range programs for DECODE_RANGE_PROGRAMS_PER_SM per SM, never more than the ranges."""
    monkeypatch.setattr(attn, "_sm_count", lambda device: 132)
    monkeypatch.setattr(attn, "DECODE_RANGE_PROGRAMS_PER_SM", 2)
    cpu = torch.device("cpu")
    assert attn._decode_range_programs(16, 64, cpu) == 17  # batch 1, 16 heads, a 64K-key table
    assert attn._decode_range_programs(16, 4, cpu) == 4
    assert attn._decode_range_programs(256, 64, cpu) == 2  # batch 16
    assert attn._decode_range_programs(1024, 64, cpu) == 1
    monkeypatch.setattr(attn, "DECODE_RANGE_PROGRAMS_PER_SM", 1)
    assert attn._decode_range_programs(16, 64, cpu) == 9


@pytest.mark.parametrize("split_size", [64, 1024])
def test_decode_tiles_in_flight_keep_bits(device, monkeypatch, split_size):
    """The decode kernel's bits do not depend on how many key tiles it keeps in flight: contexts
    of odd and even tile counts (16-key tiles), within one key range or spanning several."""
    b = make_batch([(1, n) for n in (1, 15, 17, 33, 48, 49, 100, 130)], heads=2, kv_heads=2, head_dim=64,
                   dtype=torch.float32, device=device, seed=3)  # fp32 out: any change of key order shows
    one = {}
    for tiles in (1, 2, 3, 4):
        monkeypatch.setattr(attn, "DECODE_TILES", tiles)
        monkeypatch.setattr(attn, "DECODE_TILES_SMALL_LAUNCH", tiles)
        one[tiles] = run_kernel(b, decode_from=0, split_size=split_size)
    for tiles in (2, 3, 4):
        assert_same_bits(one[tiles], one[1])
    check_against_oracle(one[1], b, torch.float32)


@pytest.mark.parametrize("split", [False, True])
def test_decode_grid_order_keeps_bits(device, monkeypatch, split):
    """Decode launches with the KV heads on grid dimension 0 (`DECODE_HEADS_FAST`), or the tokens
    there (the rule off, or more tokens than grid dimension 1 holds), give the same bits; split
    launches merge their ranges in place by (token, KV head) either way."""
    b = make_batch([(1, n) for n in (0, 70, 130)], heads=4, kv_heads=4, head_dim=32, dtype=torch.float32,
                   device=device, plane_map="last_exited", seed=9)  # more KV heads than tokens
    monkeypatch.setattr(attn, "_should_split", lambda *a: split)
    counters = attn.new_range_counters(device)
    outs = []
    for heads_fast, max_y in ((True, attn.MAX_GRID_Y), (False, attn.MAX_GRID_Y), (True, 3)):
        monkeypatch.setattr(attn, "DECODE_HEADS_FAST", heads_fast)
        monkeypatch.setattr(attn, "MAX_GRID_Y", max_y)
        outs.append(run_kernel(b, decode_from=0, split_size=64, range_counters=counters))
        assert not counters.any()
    for out in outs[1:]:
        assert_same_bits(out, outs[0])
    check_against_oracle(outs[0], b, torch.float32)


def test_split_rule(monkeypatch):
    monkeypatch.setattr(attn, "_sm_count", lambda device: 132)
    cpu = torch.device("cpu")
    small = torch.empty(10)
    assert attn._should_split(64, 4, 100, None, cpu)
    assert not attn._should_split(64, 1, 100, None, cpu)  # one key range: nothing to split
    assert not attn._should_split(264, 4, 100, None, cpu)  # enough programs already
    assert not attn._should_split(64, 4, 100, small, cpu)  # the given workspace is too small
    assert attn._should_split(64, 4, 10, small, cpu)
    assert not attn._should_split(64, 4, attn.AUTO_WORKSPACE_BYTES, None, cpu)  # would allocate too much


def test_rule_driven_split_with_small_workspace(device, monkeypatch):
    """The real rule with a small simulated GPU: splitting (or falling back when the workspace
    is too small) changes no bits."""
    monkeypatch.setattr(attn, "_sm_count", lambda device: 8)
    b = make_batch([(1, 250), (2, 190)], heads=2, kv_heads=1, device=device, seed=11)
    max_ctx = b.block_tables.shape[-1] * b.k_cache.shape[1]
    need = attention_workspace_size(b.q.shape[0], 2, 64, max_ctx, 64)
    full = run_kernel(b, split_size=64, workspace=torch.zeros(need, device=device))
    small = run_kernel(b, split_size=64, workspace=torch.zeros(need - 1, device=device))
    assert_same_bits(full, small)
    check_against_oracle(full, b, torch.float32)


def test_workspace_size():
    assert attention_workspace_size(3, 4, 128, 2048, 1024) == 3 * 4 * 2 * 130
    assert attention_workspace_size(3, 4, 128, 2049) == 3 * 4 * (-(-2049 // DEFAULT_SPLIT_SIZE)) * 130


# ---------------------------------------------------------------------------------------------
# Edge cases and argument checks
# ---------------------------------------------------------------------------------------------

def test_nothing_to_do_leaves_out_untouched(device):
    b = make_batch([(1, 10), (2, 5)], device=device, active=0)
    assert torch.isnan(run_kernel(b)).all()
    empty = Batch(b.q[:0], b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.query_start_loc)
    assert run_kernel(empty).shape == (0, *b.q.shape[1:])


@pytest.mark.parametrize("active", [0, 2])
def test_decode_padding_rows_past_the_live_count_stay_untouched(device, active):
    """Decode rows past the live count, laid out as a CUDA graph's bucket pads them (each owning its
    own token, as live decode rows do, with stale lengths and tables), are neither computed nor written: the
    decode kernel finds a row's sequence without waiting for the count, so it must still test it."""
    lens = [20, 7, 33, 12]
    b = make_batch([(1, n) for n in lens], device=device, active=active, seed=11)
    b.query_start_loc.copy_(torch.arange(5, dtype=torch.int32, device=device))
    b.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32, device=device))  # stale, yet in bounds
    got = run_kernel(b, decode_from=0)
    assert torch.isnan(got[active:]).all()
    check_against_oracle(got, b, torch.float32)


def test_argument_errors(device):
    b = make_batch([(1, 10)], heads=3, kv_heads=2, device=device)
    with pytest.raises(ValueError, match="kv heads"):
        run_kernel(b)
    b = make_batch([(1, 10)], device=device)
    with pytest.raises(ValueError, match="split_size"):
        run_kernel(b, split_size=100)
    with pytest.raises(ValueError, match="workspace"):
        run_kernel(b, workspace=torch.zeros(10, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match="plane"):
        run_kernel(b, plane_offset=1)
    with pytest.raises(ValueError, match="seq_lens"):
        paged_attention(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens.long(), b.query_start_loc)
    with pytest.raises(ValueError, match="share one of"):
        paged_attention(b.q.double(), b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.query_start_loc)
    with pytest.raises(ValueError, match="decode_from"):
        run_kernel(b, decode_from=torch.zeros(1, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="decode_from"):
        run_kernel(b, decode_from=torch.zeros(0, dtype=torch.int32, device=device))


# ---------------------------------------------------------------------------------------------
# GPU: production shapes, bf16 bits, long contexts, int64 addressing, graphs
# ---------------------------------------------------------------------------------------------

def ouro_batch(seqs, *, block_size=16, heads=16, kv_heads=16, head_dim=128, seed=0, dtype=torch.bfloat16, **kw):
    return make_batch(seqs, heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
                      dtype=dtype, device="cuda", seed=seed, **kw)


# The engines' dtypes on the GPU: bf16, and fp32 (whose tile dots take the exact fp32 path, and
# whose kernel variants the interpreter cannot tell apart: it neither contracts FMAs nor pipelines).
GPU_DTYPES = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])


@pytest.mark.gpu
@pytest.mark.parametrize("decode", ["none", "all", "some"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(16, 16, 128), (55, 55, 96), (32, 8, 128), (16, 2, 64)])
def test_gpu_production_shapes_match_reference(heads, kv_heads, head_dim, decode):
    seqs = [(1, 3000), (1, 1), (4, 777), (300, 300), (129, 2100), (1, 0), (0, 0)]
    b = with_decode_rows(ouro_batch(seqs, heads=heads, kv_heads=kv_heads, head_dim=head_dim, pad_tokens=5), decode, 1)
    got = run_kernel(b)
    ref = run_reference(b)
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    torch.testing.assert_close(got.nan_to_num(7.0), ref.nan_to_num(7.0), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("plane_map", ["last_exited", "huginn"])
@pytest.mark.parametrize("block_size", [16, 256])
def test_gpu_depth_aware_matches_reference(plane_map, block_size):
    b = ouro_batch([(1, 900), (5, 1500), (64, 64)], block_size=block_size, plane_map=plane_map)
    got = run_kernel(b)
    torch.testing.assert_close(got.nan_to_num(7.0), run_reference(b).nan_to_num(7.0), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@GPU_DTYPES
def test_gpu_decode_batch_invariance_bitwise(dtype):
    seqs = [(1, 100 + 37 * i) for i in range(64)]
    universe = ouro_batch(seqs, seed=1, dtype=dtype)
    batch = run_kernel(universe)
    for s in (0, 17, 63):
        b, tokens = sub_batch(universe, [s])
        alone = run_kernel(b)
        for t, i in tokens.items():
            assert_same_bits(alone[i], batch[t])
    order = list(reversed(range(64)))
    b, tokens = sub_batch(universe, order, pad_seqs=7, pad_tokens=3)
    shuffled = run_kernel(b)
    for t, i in tokens.items():
        assert_same_bits(shuffled[i], batch[t])


@pytest.mark.gpu
@GPU_DTYPES
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(16, 16, 128), (55, 55, 96), (32, 4, 128)])
def test_gpu_decode_verify_prefill_same_bits(heads, kv_heads, head_dim, dtype):
    context, prefill_len = 1500, 300
    universe = ouro_batch([(prefill_len, context + prefill_len)], heads=heads, kv_heads=kv_heads,
                          head_dim=head_dim, seed=2, dtype=dtype)
    prefill_out = run_kernel(universe)
    for pos in (context, context + 77, context + prefill_len - 1):
        query = universe.q[pos - context]
        for q_len in (1, 4):
            qs = torch.cat([torch.randn(q_len - 1, *query.shape, device="cuda").to(query), query[None]])
            b = Batch(qs, universe.k_cache, universe.v_cache, universe.block_tables,
                      torch.tensor([pos + 1], dtype=torch.int32, device="cuda"),
                      torch.tensor([0, q_len], dtype=torch.int32, device="cuda"))
            assert_same_bits(run_kernel(b)[-1], prefill_out[pos - context])


@pytest.mark.gpu
@GPU_DTYPES
@pytest.mark.parametrize("plane_map", ["plain", "last_exited", "huginn"])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(16, 16, 128), (55, 55, 96), (32, 4, 128)])
def test_gpu_generated_rows_same_bits_in_decode_and_recompute(heads, kv_heads, head_dim, plane_map, dtype):
    """Production shapes, bf16 and fp32: generated rows recomputed in a prefill launch (beside
    prompt rows, split or not) have the bits of the same rows run as decode steps in a crowd."""
    context, chunk, first_generated = 1400, 300, 1530
    universe = ouro_batch([(chunk, context + chunk)] + [(1, 200 + 300 * i) for i in range(9)], heads=heads,
                          kv_heads=kv_heads, head_dim=head_dim, plane_map=plane_map, seed=8, dtype=dtype)
    universe.kwargs["decode_from"] = torch.tensor([first_generated] + [0] * 9, dtype=torch.int32, device="cuda")
    recomputed = run_kernel(universe)
    ref = run_reference(universe)
    torch.testing.assert_close(recomputed.nan_to_num(7.0), ref.nan_to_num(7.0), atol=2e-2, rtol=2e-2)
    depth = universe.kwargs.get("query_depth")
    positions = list(range(first_generated, context + chunk, 7))
    rows = [p - context for p in positions]
    kw = {k: v for k, v in universe.kwargs.items() if k not in ("decode_from", "query_depth")}
    if depth is not None:
        kw["query_depth"] = depth[:1].repeat(len(rows))
    n = len(rows)
    b = Batch(universe.q[rows], universe.k_cache, universe.v_cache, universe.block_tables,
              torch.tensor(positions, dtype=torch.int32, device="cuda") + 1,
              torch.arange(n + 1, dtype=torch.int32, device="cuda"), {**kw, "seq_slots": torch.zeros(n, dtype=torch.int32, device="cuda")})
    assert_same_bits(run_kernel(b, decode_from=0), recomputed[rows])


@pytest.mark.gpu
def test_gpu_split_matches_unsplit_bitwise(monkeypatch):
    b = ouro_batch([(1, 20000), (3, 9000), (1, 1), (0, 0)], seed=4)
    for decode in (None, 0):
        monkeypatch.setattr(attn, "_should_split", lambda *a: False)
        unsplit = run_kernel(b, decode_from=decode)
        monkeypatch.setattr(attn, "_should_split", lambda *a: True)
        split = run_kernel(b, decode_from=decode)
        assert_same_bits(split, unsplit)
        counters = new_range_counters("cuda")
        for _ in range(3):
            assert_same_bits(run_kernel(b, decode_from=decode, range_counters=counters), unsplit)
        assert not counters.any()
        if decode == 0:  # range programs that take several of a row's 20 ranges each
            for programs in (1, 3):
                monkeypatch.setattr(attn, "_decode_range_programs", lambda rows, n, dev, p=programs: min(n, p))
                assert_same_bits(run_kernel(b, decode_from=0), unsplit)
                assert_same_bits(run_kernel(b, decode_from=0, range_counters=counters), unsplit)
                assert not counters.any()
        monkeypatch.undo()
        assert_same_bits(run_kernel(b, decode_from=decode), unsplit)  # whatever the real rule picks
        if decode == 0:  # the other tile depths
            monkeypatch.setattr(attn, "DECODE_TILES", 5 - attn.DECODE_TILES)
            monkeypatch.setattr(attn, "DECODE_TILES_SMALL_LAUNCH", 5 - attn.DECODE_TILES_SMALL_LAUNCH)
            assert_same_bits(run_kernel(b, decode_from=decode), unsplit)
            monkeypatch.undo()
    ref = run_reference(b)
    torch.testing.assert_close(split.nan_to_num(7.0), ref.nan_to_num(7.0), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_gpu_int64_addressing():
    """A cache past 2^31 elements: blocks at the far end must be addressed correctly."""
    block_size, kvh, d = 16, 8, 128
    num_blocks = (2**31) // (block_size * kvh * d) + 64
    k = torch.empty(num_blocks, block_size, kvh, d, dtype=torch.bfloat16, device="cuda")
    v = torch.empty_like(k)
    seq_len = 40 * block_size
    ids = torch.arange(num_blocks - 40, num_blocks, device="cuda", dtype=torch.int32)
    k[ids.long()] = torch.randn(40, block_size, kvh, d, device="cuda").bfloat16()
    v[ids.long()] = torch.randn(40, block_size, kvh, d, device="cuda").bfloat16()
    q = torch.randn(1, 16, d, device="cuda").bfloat16()
    args = (q, k, v, ids[None], torch.tensor([seq_len], dtype=torch.int32, device="cuda"),
            torch.tensor([0, 1], dtype=torch.int32, device="cuda"))
    got = paged_attention(*args)
    kk = k[ids.long()].reshape(-1, kvh, d).float().repeat_interleave(2, dim=1)
    vv = v[ids.long()].reshape(-1, kvh, d).float().repeat_interleave(2, dim=1)
    w = torch.softmax(torch.einsum("hd,khd->hk", q[0].float(), kk) / math.sqrt(d), dim=-1)
    torch.testing.assert_close(got[0].float(), torch.einsum("hk,khd->hd", w, vv), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_gpu_cuda_graph_no_allocation_and_same_bits():
    b = ouro_batch([(1, 5000 + 100 * i) for i in range(4)], seed=6)
    max_ctx = b.block_tables.shape[-1] * b.k_cache.shape[1]
    workspace = new_attention_workspace(b.q.shape[0], 16, 128, max_ctx, device="cuda")
    out = torch.empty_like(b.q)
    eager = run_kernel(b).clone()
    paged_attention(*b.args(), out=out, workspace=workspace)  # compile outside capture
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    paged_attention(*b.args(), out=out, workspace=workspace)
    assert torch.cuda.memory_allocated() == before
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_attention(*b.args(), out=out, workspace=workspace)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert_same_bits(out, eager)
