"""The FlashAttention adapter (rlt_kernels.flash) against rlt's torch reference attention.

On the CPU FlashAttention is replaced by the pure-torch stand-ins of tests/flash_standin.py (FA2's
``flash_attn_varlen_func`` and FA3's ``flash_attn_with_kvcache``, real signatures and semantics);
on a GPU with flash-attn installed the `gpu` tests compare the real library with the Triton kernel.
"""

from __future__ import annotations

import pytest
import torch

import flash_standin
from rlt_kernels import attention, flash
from rlt_kernels import reference as ref

needs_flash = pytest.mark.skipif(not (flash.flash_available() and torch.cuda.is_available()),
                                 reason="flash-attn is not installed (pip install -e .[flash])")


@pytest.fixture(params=["fa2", "fa3"])
def standin(request, monkeypatch):
    """The adapter runs on the stand-in of FlashAttention 2 or 3."""
    flash_standin.install(monkeypatch, request.param)
    yield request.param
    monkeypatch.undo()
    flash._flash_module.cache_clear()


def paged_batch(seqs, *, planes=1, heads=4, kv_heads=2, head_dim=16, block_size=256, spare_rows=0, pad_tokens=2,
                dtype=torch.float32, device="cpu", seed=0):
    """seqs: list of (q_len, seq_len). Every plane of every row gets its own scattered blocks.

    Returns (q, k_cache, v_cache, block_tables [planes, rows, max_blocks], seq_lens, qsl) and seq_slots
    (a permutation into rows when spare_rows > 0, else None)."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-s // block_size) for _, s in seqs]
    max_blocks = max(per_seq + [0]) + 1
    rows = len(seqs) + spare_rows
    num_blocks = planes * rows * max_blocks + 1
    ids = torch.randperm(num_blocks, generator=gen)[: planes * rows * max_blocks].int()
    tables = ids.view(planes, rows, max_blocks).clone()
    tables[..., -1] = -1  # never needed: one spare (unallocated) entry per row
    slots = torch.randperm(rows, generator=gen)[: len(seqs)].int() if spare_rows else None
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    q_lens = torch.tensor([ql for ql, _ in seqs], dtype=torch.int32)
    qsl = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_lens, 0)
    q = torch.randn(int(q_lens.sum()) + pad_tokens, heads, head_dim, generator=gen).to(dtype)
    seq_lens = torch.tensor([s for _, s in seqs], dtype=torch.int32)
    args = [t.to(device) for t in (q, k, v, tables, seq_lens, qsl)]
    return args, None if slots is None else slots.to(device)


MIXED = [(1, 700), (1, 1), (5, 300), (40, 40), (3, 520), (1, 0), (0, 0)]


def compare(args, atol=1e-5, **options):
    """The adapter and the reference on the same inputs, both into NaN-poisoned outputs."""
    q = args[0]
    ours = ref.paged_attention(*args, out=torch.full_like(q, float("nan")), **options)
    theirs = flash.paged_attention(*args, out=torch.full_like(q, float("nan")), **options)
    torch.testing.assert_close(theirs, ours, atol=atol, rtol=1e-5, equal_nan=True)
    return theirs


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4), (4, 1)])
def test_plain_calls_match_reference(standin, heads, kv_heads):
    block_size = 256 if standin == "fa2" else 16
    args, slots = paged_batch(MIXED, heads=heads, kv_heads=kv_heads, block_size=block_size, spare_rows=3)
    res = compare(args, seq_slots=slots)
    assert torch.isnan(res[-2:]).all()  # padding tokens owned by no sequence keep out's values
    assert not torch.isnan(res[:-2]).any()


def test_scale_and_bf16_match_reference(standin):
    block_size = 256 if standin == "fa2" else 32
    args, _ = paged_batch(MIXED[:5], block_size=block_size, dtype=torch.bfloat16, seed=1)
    compare(args, atol=2e-2, scale=0.3)


@pytest.mark.parametrize("query_depth,plane_offset,plane_modulus", [
    (2, 0, None),   # LAST_EXITED with copy reads: the query's own plane
    (5, 1, 3),      # Huginn core layers: plane 1 + 5 % 3
    (0, 0, 1),      # a boundary layer / SHARED: plane 0
    ("per-seq", 1, 3),
])
def test_plane_selection_matches_reference(standin, query_depth, plane_offset, plane_modulus):
    block_size = 256 if standin == "fa2" else 16
    args, slots = paged_batch(MIXED, planes=4, block_size=block_size, spare_rows=2, seed=2)
    if query_depth == "per-seq":
        query_depth = torch.tensor([0, 4, 2, 7, 1, 3, 5], dtype=torch.int32)
    compare(args, seq_slots=slots, query_depth=query_depth, plane_offset=plane_offset, plane_modulus=plane_modulus)


def test_sequences_past_active_seqs_are_skipped(standin):
    """Dead sequences may carry any seq_len, slot and depth: no read out of bounds, rows untouched."""
    block_size = 256 if standin == "fa2" else 16
    args, slots = paged_batch(MIXED, planes=2, block_size=block_size, spare_rows=2, seed=3)
    q, k, v, tables, seq_lens, qsl = args
    seq_lens[4:] = 10_000  # far past the tables' capacity
    slots[4:] = 99  # no such row
    depths = torch.tensor([0, 1, 1, 0, 7, -9, 1000], dtype=torch.int32)
    active = torch.tensor([4], dtype=torch.int32)
    res = compare(args, seq_slots=slots, query_depth=depths, active_seqs=active)
    assert torch.isnan(res[int(qsl[4]):]).all()
    assert not torch.isnan(res[: int(qsl[4])]).any()


def test_one_token_with_padding_sequences(standin):
    """A one-token prefill padded with empty sequences (FA2 must not take its one-query-per-row path)."""
    block_size = 256 if standin == "fa2" else 16
    args, _ = paged_batch([(1, 30), (0, 0), (0, 0)], block_size=block_size, pad_tokens=0)
    compare(args, active_seqs=torch.tensor([1], dtype=torch.int32))


def test_unowned_rows_are_zero_without_out(standin):
    block_size = 256 if standin == "fa2" else 16
    args, _ = paged_batch([(1, 30), (2, 2)], block_size=block_size, pad_tokens=3)
    res = flash.paged_attention(*args, active_seqs=torch.tensor([1], dtype=torch.int32))
    assert torch.equal(res[1:], torch.zeros_like(res[1:]))
    torch.testing.assert_close(res[:1], ref.paged_attention(*args)[:1])


def test_fa2_needs_pages_of_256(standin):
    args, _ = paged_batch([(1, 30)], block_size=16)
    if standin == "fa2":
        with pytest.raises(ValueError, match="block_size to be a multiple of 256"):
            flash.paged_attention(*args)
    else:
        compare(args)


def test_key_depth_is_refused():
    args, _ = paged_batch([(1, 30)], planes=2)
    with pytest.raises(ValueError, match="key_depth"):
        flash.paged_attention(*args, query_depth=1, key_depth=torch.zeros(9, 256, dtype=torch.int32))


def test_planes_outside_the_table_are_refused(standin):
    args, _ = paged_batch([(1, 30)], planes=2)
    with pytest.raises(ValueError, match="plane_offset"):
        flash.paged_attention(*args, plane_offset=1, plane_modulus=2)


@pytest.mark.skipif(flash.flash_available(), reason="flash-attn is installed here")
def test_missing_backend_says_how_to_install():
    args, _ = paged_batch([(1, 30)])
    with pytest.raises(RuntimeError, match="pip install"):
        flash.paged_attention(*args)


@pytest.mark.gpu
@needs_flash
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(16, 16, 128), (32, 8, 128), (8, 8, 64)])
def test_gpu_matches_triton_kernel(heads, kv_heads, head_dim):
    seqs = [(1, 700), (1, 1), (5, 1300), (200, 200), (64, 2000), (1, 0)]
    args, slots = paged_batch(seqs, planes=3, heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=256,
                              spare_rows=3, dtype=torch.bfloat16, device="cuda")
    options = dict(seq_slots=slots, query_depth=4, plane_offset=1, plane_modulus=2,
                   active_seqs=torch.tensor([5], dtype=torch.int32, device="cuda"))
    q = args[0]
    ours = attention.paged_attention(*args, out=torch.full_like(q, float("nan")), **options)
    theirs = flash.paged_attention(*args, out=torch.full_like(q, float("nan")), **options)
    assert torch.isnan(theirs[-3:]).all()  # the dead sequence's row and the padding tokens stay untouched
    torch.testing.assert_close(theirs[:-3].float(), ours[:-3].float(), atol=2e-2, rtol=2e-2)
