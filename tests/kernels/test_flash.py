"""Optional FlashAttention adapter: unsupported options fail clearly everywhere; on a GPU with
flash-attn installed it matches the Triton kernel (skipped cleanly when absent)."""

from __future__ import annotations

import pytest
import torch

from rlt_kernels import attention, flash
from rlt_kernels.flash import flash_available

needs_flash = pytest.mark.skipif(not flash_available(), reason="flash-attn is not installed (pip install -e .[flash])")


def plain_batch(seqs, *, heads=4, kv_heads=2, head_dim=128, block_size=256, device="cpu", pad_tokens=2,
                spare_rows=0, seed=0):
    """seqs: list of (q_len, seq_len). Random scattered blocks, bf16, a NaN-poisoned output."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-s // block_size) for _, s in seqs]
    max_blocks = max(per_seq + [0]) + 1
    num_blocks = sum(per_seq) + 2
    rows = len(seqs) + spare_rows
    tables = torch.randperm(rows * max_blocks, generator=gen).remainder(num_blocks).int().view(rows, max_blocks)
    slots = (torch.randperm(rows, generator=gen)[: len(seqs)] if spare_rows else torch.arange(len(seqs))).int()
    ids = torch.randperm(num_blocks, generator=gen).int()
    used = 0
    for n, slot in zip(per_seq, slots.tolist()):
        tables[slot, :n] = ids[used: used + n]
        used += n
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).bfloat16()
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).bfloat16()
    q_lens = torch.tensor([ql for ql, _ in seqs], dtype=torch.int32)
    qsl = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_lens, 0)
    q = torch.randn(int(q_lens.sum()) + pad_tokens, heads, head_dim, generator=gen).bfloat16()
    seq_lens = torch.tensor([s for _, s in seqs], dtype=torch.int32)
    args = [t.to(device) for t in (q, k, v, tables, seq_lens, qsl)]
    return args, {"seq_slots": slots.to(device)} if spare_rows else {}


@pytest.mark.parametrize("option,value,name", [
    ("query_depth", 1, "query_depth"),
    ("key_depth", torch.zeros(4, 256, dtype=torch.int32), "key_depth"),
    ("plane_offset", 1, "plane_offset"),
    ("plane_modulus", 1, "plane_modulus"),
    ("active_seqs", torch.ones(1, dtype=torch.int32), "active_seqs"),
])
def test_unsupported_options_are_named(option, value, name):
    args, _ = plain_batch([(1, 30)])
    with pytest.raises(ValueError, match=name):
        flash.paged_attention(*args, **{option: value})


def test_several_planes_are_refused():
    (q, k, v, tables, seq_lens, qsl), _ = plain_batch([(1, 30)])
    with pytest.raises(ValueError, match="several planes"):
        flash.paged_attention(q, k, v, torch.stack([tables, tables]), seq_lens, qsl)


def test_fp32_is_refused():
    (q, k, v, tables, seq_lens, qsl), _ = plain_batch([(1, 30)])
    with pytest.raises(ValueError, match="bf16 or fp16"):
        flash.paged_attention(q.float(), k.float(), v.float(), tables, seq_lens, qsl)


@pytest.mark.skipif(flash_available(), reason="flash-attn is installed here")
def test_missing_backend_says_how_to_install():
    args, _ = plain_batch([(1, 30)])
    with pytest.raises(RuntimeError, match="pip install"):
        flash.paged_attention(*args)


@pytest.mark.gpu
@needs_flash
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(16, 16, 128), (32, 8, 128), (8, 8, 64)])
def test_gpu_matches_triton_kernel(heads, kv_heads, head_dim):
    seqs = [(1, 700), (1, 1), (5, 1300), (200, 200), (64, 2000), (1, 0)]
    args, kwargs = plain_batch(seqs, heads=heads, kv_heads=kv_heads, head_dim=head_dim, device="cuda",
                               spare_rows=3)
    q = args[0]
    ours = attention.paged_attention(*args, out=torch.full_like(q, float("nan")), **kwargs)
    theirs = flash.paged_attention(*args, out=torch.full_like(q, float("nan")), **kwargs)
    assert torch.isnan(theirs[-2:]).all()  # padding tokens owned by no sequence stay untouched
    torch.testing.assert_close(theirs[:-2].float(), ours[:-2].float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@needs_flash
def test_gpu_decode_rows_do_not_depend_on_the_batch():
    if flash._flash_module()[0] != "fa3":
        pytest.skip("FlashAttention 2 picks its own key splits for single-query batches")
    args, _ = plain_batch([(1, 300 + 97 * i) for i in range(32)], device="cuda", pad_tokens=0)
    q, k, v, tables, seq_lens, qsl = args
    batch = flash.paged_attention(*args)
    for s in (0, 31):
        alone = flash.paged_attention(q[s: s + 1], k, v, tables[s: s + 1], seq_lens[s: s + 1], qsl[:2])
        assert torch.equal(alone[0], batch[s])
