"""FP8 K/V: the scatter kernels quantize on write, both attention kernels dequantize on read.

Oracles: the quantized bytes equal torch's own float8_e4m3fn rounding of x / scale (fp32), and
attention over an FP8 cache equals fp64 attention over the dequantized cache.
"""

import math

import pytest
import torch

from rlt_kernels import attention, kv_cache, norms
from rlt_kernels.fp8 import FP8_DTYPE, FP8_MAX

from checks import assert_same_bits, randn, seeded

KVH, D, BS, NB = 2, 32, 16, 12
K_SCALE = [0.5, 3.0]
V_SCALE = [0.25, 1.5]


def _scales(device):
    return (torch.tensor(K_SCALE, device=device), torch.tensor(V_SCALE, device=device))


def _caches(device):
    return [torch.zeros((NB, BS, KVH, D), dtype=FP8_DTYPE, device=device) for _ in range(2)]


def _expected_bytes(x, scale):
    """torch's round-to-nearest-even of x / scale into e4m3 (clamped), as bytes."""
    return (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_scatter_quantizes_like_torch(device, dtype):
    gen = seeded(1, device)
    k = randn((6, KVH, D), dtype, device, gen, scale=40.0)  # spans subnormals, binade carries and clamping
    v = randn((6, KVH, D), dtype, device, gen, scale=4.0)
    k[0, 0, :4] = torch.tensor([7.8, -7.9, 500.0, 1e-4], dtype=dtype) * K_SCALE[0]
    k[1, 0, :3] = torch.tensor([-1e-4, -0.0, 1e-4], dtype=dtype) * K_SCALE[0]  # round to -0, -0, +0 as torch's cast
    ks, vs = _scales(device)
    slots = torch.tensor([3, 17, -1, 40, 5, 100], dtype=torch.int64, device=device)
    active = torch.tensor([5], dtype=torch.int32, device=device)
    kc, vc = _caches(device)
    rk, rv = _caches(device)
    kv_cache.kv_scatter(k, v, kc, vc, slots, k_scale=ks, v_scale=vs, active_rows=active)
    kv_cache.kv_scatter_reference(k, v, rk, rv, slots, k_scale=ks, v_scale=vs, active_rows=active)
    assert_same_bits(kc.view(torch.uint8), rk.view(torch.uint8))
    assert_same_bits(vc.view(torch.uint8), rv.view(torch.uint8))
    flat_k, flat_v = kc.view(-1, KVH, D), vc.view(-1, KVH, D)
    for row, slot in ((0, 3), (1, 17), (3, 40), (4, 5)):
        assert torch.equal(flat_k[slot].view(torch.uint8), _expected_bytes(k[row], ks))
        assert torch.equal(flat_v[slot].view(torch.uint8), _expected_bytes(v[row], vs))
    assert not flat_k[100].view(torch.uint8).any()  # past the active count: not written


def test_rope_kv_scatter_quantizes_the_rotated_keys(device):
    """fp32 inputs: the CPU interpreter truncates fp32 -> bf16 casts (the rotated k is rounded to
    its own dtype before it is quantized), the GPU rounds them like torch."""
    gen = seeded(2, device)
    q = randn((4, 4, D), torch.float32, device, gen)
    k = randn((4, KVH, D), torch.float32, device, gen, scale=8.0)
    v = randn((4, KVH, D), torch.float32, device, gen, scale=8.0)
    pos = torch.tensor([0, 5, 9, 30], device=device)
    cos_sin = norms.rope_cos_sin(64, D, 10000.0, device=device)
    slots = torch.tensor([0, 21, 7, 64], dtype=torch.int64, device=device)
    ks, vs = _scales(device)
    kc, vc = _caches(device)
    rk, rv = _caches(device)
    q_out = kv_cache.rope_kv_scatter(q, k, v, pos, cos_sin, kc, vc, slots, k_scale=ks, v_scale=vs)
    q_ref = kv_cache.rope_kv_scatter_reference(q, k, v, pos, cos_sin, rk, rv, slots, k_scale=ks, v_scale=vs)
    assert_same_bits(q_out, q_ref)
    assert_same_bits(kc.view(torch.uint8), rk.view(torch.uint8))
    assert_same_bits(vc.view(torch.uint8), rv.view(torch.uint8))
    k_rot = norms.apply_rope_reference(k, pos, cos_sin)
    assert torch.equal(kc.view(-1, KVH, D)[21].view(torch.uint8), _expected_bytes(k_rot[1], ks))


def _fp64_attention(q, kc, vc, ks, vs, tables, seq_lens, qsl):
    """Causal attention in fp64 over the dequantized cache, bottom-right aligned (on the CPU; any
    head count and head size)."""
    h, d, bs = q.shape[1], q.shape[-1], kc.shape[1]
    group = h // kc.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for s in range(seq_lens.shape[0]):
        n, lo, hi = int(seq_lens[s]), int(qsl[s]), int(qsl[s + 1])
        keys = torch.arange(n, device=kc.device)
        blocks, offs = tables[s, keys // bs].long(), keys % bs
        kk, vv = ((c[blocks, offs].double() * scale.double()[None, :, None]).cpu()
                  for c, scale in ((kc, ks), (vc, vs)))  # [n, KV heads, d]
        for i, t in enumerate(range(lo, hi)):
            visible = n - (hi - lo) + i + 1
            for head in range(h):
                kvh = head // group
                w = torch.softmax(kk[:visible, kvh] @ q[t, head].double().cpu() / math.sqrt(d), 0)
                out[t, head] = w @ vv[:visible, kvh]
    return out


@pytest.mark.parametrize("decode_from", [None, 0], ids=["tile-kernel", "decode-kernel"])
@pytest.mark.parametrize("split", [False, True], ids=["unsplit", "split"])
def test_attention_reads_fp8_caches(device, monkeypatch, decode_from, split):
    """Both kernels, unsplit and split into key ranges of 64 (the combine kernels apply V's
    scale); the split and unsplit results have the same bits."""
    split_size = 64
    monkeypatch.setattr(attention, "_should_split", lambda *a: split)
    gen = seeded(3, device)
    h = 4
    kc = randn((NB, BS, KVH, D), torch.float32, device, gen, scale=4.0).to(FP8_DTYPE)
    vc = randn((NB, BS, KVH, D), torch.float32, device, gen, scale=4.0).to(FP8_DTYPE)
    ks, vs = _scales(device)
    tables = torch.randperm(NB, generator=gen, device=device).int().view(2, 6)
    seq_lens = torch.tensor([90, 7], dtype=torch.int32, device=device)
    qsl = torch.tensor([0, 1, 4], dtype=torch.int32, device=device)  # one decode query, three trailing queries
    q = randn((4, h, D), torch.bfloat16, device, gen)
    args = (q, kc, vc, tables, seq_lens, qsl)
    ws = attention.new_attention_workspace(4, h, D, 6 * BS, split_size=split_size, device=device)
    out = attention.paged_attention(*args, k_scale=ks, v_scale=vs, decode_from=decode_from, split_size=split_size,
                                    workspace=ws, out=torch.full_like(q, float("nan")))
    ref = attention.paged_attention_reference(*args, k_scale=ks, v_scale=vs)
    exact = _fp64_attention(q, kc, vc, ks, vs, tables, seq_lens, qsl)
    torch.testing.assert_close(out.double().cpu(), exact, rtol=2**-7, atol=2**-6)
    torch.testing.assert_close(ref.double().cpu(), exact, rtol=2**-7, atol=2**-6)
    # Batch invariance: the decode query alone has the bits it has beside the other sequence.
    alone = attention.paged_attention(q[:1], kc, vc, tables[:1], seq_lens[:1], qsl[:2], k_scale=ks, v_scale=vs,
                                      decode_from=decode_from, split_size=split_size)
    assert_same_bits(alone[0], out[0])
    monkeypatch.setattr(attention, "_should_split", lambda *a: not split)
    other = attention.paged_attention(*args, k_scale=ks, v_scale=vs, decode_from=decode_from, split_size=split_size,
                                      workspace=ws)
    assert_same_bits(other, out)


def test_decode_reads_fp8_words_with_the_bytes_bits(device, monkeypatch):
    """The decode kernel reads an aligned FP8 cache as int32 words and widens each word in
    registers; a cache whose rows are not 16-byte aligned takes the per-byte cast. Both give the
    same bits, unsplit and split."""
    gen = seeded(5, device)
    h = 4
    padded = [randn((NB, BS, KVH, D + 4), torch.float32, device, gen, scale=4.0).to(FP8_DTYPE) for _ in range(2)]
    unaligned = [c[..., :D] for c in padded]  # head stride D + 4: rows not 16-byte aligned
    aligned = [c.contiguous() for c in unaligned]
    assert attention._kv_rows_aligned(aligned[0]) and not attention._kv_rows_aligned(unaligned[0])
    ks, vs = _scales(device)
    tables = torch.randperm(NB, generator=gen, device=device).int().view(2, 6)
    seq_lens = torch.tensor([90, 37], dtype=torch.int32, device=device)
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    q = randn((2, h, D), torch.bfloat16, device, gen)
    for split in (False, True):
        monkeypatch.setattr(attention, "_should_split", lambda *a: split)
        words, bytes_ = (attention.paged_attention(q, kc, vc, tables, seq_lens, qsl, k_scale=ks, v_scale=vs,
                                                   decode_from=0, split_size=64) for kc, vc in (aligned, unaligned))
        assert_same_bits(words, bytes_)
        exact = _fp64_attention(q, *aligned, ks, vs, tables, seq_lens, qsl)
        torch.testing.assert_close(words.double().cpu(), exact, rtol=2**-7, atol=2**-6)


def test_fp8_cache_scale_errors(device):
    kc, vc = _caches(device)
    k = torch.zeros((1, KVH, D), device=device)
    slots = torch.zeros(1, dtype=torch.int64, device=device)
    ks, vs = _scales(device)
    for fn in (kv_cache.kv_scatter, kv_cache.kv_scatter_reference):
        with pytest.raises(ValueError, match=r"float8_e4m3fn cache needs k_scale: a contiguous fp32 tensor \[2\]"):
            fn(k, k, kc, vc, slots)
        with pytest.raises(ValueError, match="v_scale is for float8_e4m3fn caches"):
            fn(k, k, kc.float(), vc.float(), slots, v_scale=vs)
    q = torch.zeros((1, 4, D), device=device)
    one = torch.ones(1, dtype=torch.int32, device=device)
    for fn in (attention.paged_attention, attention.paged_attention_reference):
        with pytest.raises(ValueError, match=r"needs v_scale: a contiguous fp32 tensor \[2\]"):
            fn(q, kc, vc, torch.zeros((1, 1), dtype=torch.int32, device=device), one,
               torch.tensor([0, 1], dtype=torch.int32, device=device), k_scale=ks, v_scale=vs[:1])


def test_fp8_decode_warps_are_fixed_by_the_cache_and_group():
    """The decode kernel's warps shape its reduction trees, so they follow the model's shape and
    cache dtype alone, never the launch: over an FP8 cache one warp with one query head per KV head
    (Ouro, MHA), 2 for grouped heads (which hold GP accumulators a lane), 4 over caches in q's
    dtype; `_decode_shape` launches that count whatever the batch."""
    assert attention.decode_warps(True, 1) == attention.DECODE_WARPS_FP8 == 1
    for gp in (2, 4, 8):
        assert attention.decode_warps(True, gp) == attention.DECODE_WARPS_FP8_GROUPED == 2
    for gp in (1, 2, 8):
        assert attention.decode_warps(False, gp) == attention.DECODE_WARPS == 4
    assert attention._decode_shape(16, 16, 128, kv_fp8=True)["num_warps"] == 1  # Ouro
    assert attention._decode_shape(32, 8, 128, kv_fp8=True)["num_warps"] == 2  # 4 query heads a KV head
    assert attention._decode_shape(16, 16, 128, kv_fp8=False)["num_warps"] == 4


@pytest.mark.gpu
def test_gpu_full_fp8_decode_launch_keeps_batch_invariance():
    """Ouro's shape (16 heads of 128, MHA) over an FP8 cache, 256 decode rows: a full launch of
    4,096 (token, KV head) programs of one warp. Each row has the bits it gets alone (a split-rule
    small launch), among 64 rows (unsplit) and in a shuffled crowd; all are close to fp64 attention."""
    device, gen = torch.device("cuda"), seeded(21, torch.device("cuda"))
    seqs, heads, dim, bs, most = 256, 16, 128, 16, 256
    assert attention._decode_shape(heads, heads, dim, kv_fp8=True)["num_warps"] == 1
    blocks = most // bs
    kc, vc = (randn((seqs * blocks + 1, bs, heads, dim), torch.float32, device, gen, scale=3.0).to(FP8_DTYPE)
              for _ in range(2))
    ks, vs = (0.5 + torch.rand(heads, generator=gen, device=device) for _ in range(2))
    tables = (1 + torch.randperm(seqs * blocks, generator=gen, device=device)).int().view(seqs, blocks)
    lens = torch.randint(100, most + 1, (seqs,), generator=gen, device=device, dtype=torch.int32)
    q = randn((seqs, heads, dim), torch.bfloat16, device, gen)

    def decode(rows):
        rows = torch.as_tensor(rows, device=device)
        qsl = torch.arange(len(rows) + 1, dtype=torch.int32, device=device)
        return attention.paged_attention(q[rows], kc, vc, tables[rows], lens[rows], qsl, k_scale=ks, v_scale=vs,
                                         decode_from=0)

    crowd = decode(range(seqs))
    for s in (0, 77, 255):
        assert_same_bits(decode([s])[0], crowd[s])
    assert_same_bits(decode(range(64, 128)), crowd[64:128])
    order = torch.randperm(seqs, generator=gen, device=device)
    assert_same_bits(decode(order), crowd[order])
    rows = torch.arange(0, seqs, 15, device=device)
    exact = _fp64_attention(q[rows], kc, vc, ks, vs, tables[rows], lens[rows],
                            torch.arange(len(rows) + 1, dtype=torch.int32, device=device))
    torch.testing.assert_close(crowd[rows].double().cpu(), exact, rtol=2**-7, atol=2**-6)


def _fp8_decode_case(device, seed, lens, block_size=BS, h=4):
    """Random FP8 caches with `lens` keys per sequence (one decode query each) in blocks of
    `block_size`, block 0 left to no sequence; the same keys for any block size."""
    gen = seeded(seed, device)
    total = sum(lens)
    keys = randn((total, KVH, D), torch.float32, device, gen, scale=4.0).to(FP8_DTYPE)
    vals = randn((total, KVH, D), torch.float32, device, gen, scale=4.0).to(FP8_DTYPE)
    q = randn((len(lens), h, D), torch.bfloat16, device, gen)
    per_seq = [-(-n // block_size) for n in lens]
    nb = 1 + sum(per_seq)
    kc, vc = (torch.zeros((nb, block_size, KVH, D), dtype=FP8_DTYPE, device=device) for _ in range(2))
    tables = torch.zeros((len(lens), max(per_seq)), dtype=torch.int32, device=device)
    order = 1 + torch.randperm(nb - 1, generator=gen, device=device)
    used, first = 0, 0
    for s, n in enumerate(lens):
        ids = order[used:used + per_seq[s]]
        used += per_seq[s]
        tables[s, : per_seq[s]] = ids.int()
        for j in range(n):
            kc[ids[j // block_size], j % block_size] = keys[first + j]
            vc[ids[j // block_size], j % block_size] = vals[first + j]
        first += n
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    qsl = torch.arange(len(lens) + 1, dtype=torch.int32, device=device)
    return q, kc, vc, tables, seq_lens, qsl


def test_decode_reads_no_fp8_byte_past_its_keys(device, monkeypatch):
    """FP8 key rows are read by whole key tiles, unmasked: bytes past a row's last key (0x7f: NaN on
    the GPU, 480 under the interpreter), in its last block and in block 0, which tiles past the keys
    fall back to, never reach its output, unsplit or split."""
    _check_no_byte_past_keys(device, monkeypatch)


@pytest.mark.gpu
def test_gpu_decode_reads_no_fp8_byte_past_its_keys(monkeypatch):
    """The same on the GPU, where 0x7f widens to NaN: a V row read past the keys would poison the
    output (weight 0 times NaN)."""
    _check_no_byte_past_keys(torch.device("cuda"), monkeypatch)


def _check_no_byte_past_keys(device, monkeypatch):
    q, kc, vc, tables, seq_lens, qsl = _fp8_decode_case(device, 7, [90, 37, 16, 1])
    ks, vs = _scales(device)
    dirty = [c.clone() for c in (kc, vc)]
    nan = torch.tensor(0x7F, dtype=torch.uint8, device=device).view(FP8_DTYPE)
    for c in dirty:
        c[0] = nan
        for s, n in enumerate(seq_lens.tolist()):
            if n % BS:
                c[tables[s, n // BS], n % BS:] = nan
    for split in (False, True):
        monkeypatch.setattr(attention, "_should_split", lambda *a: split)
        clean, stained = (attention.paged_attention(q, k, v, tables, seq_lens, qsl, k_scale=ks, v_scale=vs,
                                                    decode_from=0, split_size=64) for k, v in ((kc, vc), dirty))
        assert_same_bits(stained, clean)
        exact = _fp64_attention(q, kc, vc, ks, vs, tables, seq_lens, qsl)
        torch.testing.assert_close(clean.double().cpu(), exact, rtol=2**-7, atol=2**-6)


def test_fp8_decode_bits_do_not_depend_on_block_size_or_tiles_in_flight(device, monkeypatch):
    """The FP8 decode kernel applies its key tiles in pairs, the pairs counted from each key range's
    start: the same keys give the same bits with two or four tiles in flight, in blocks of 8 keys
    (tiles over two blocks: per-key block ids), 16, 32 or 64 (a tile in one block: one block id),
    for odd and even tile counts, within one range and over several, split or not."""
    lens = [1, 15, 16, 17, 33, 48, 49, 100, 130]
    ks, vs = _scales(device)
    first = None
    for block_size in (8, 16, 32, 64):
        args = _fp8_decode_case(device, 11, lens, block_size=block_size)
        for tiles in (2, 4):
            monkeypatch.setattr(attention, "DECODE_TILES_FP8", tiles)
            for split in (False, True):
                monkeypatch.setattr(attention, "_should_split", lambda *a: split)
                out = attention.paged_attention(*args, k_scale=ks, v_scale=vs, decode_from=0, split_size=64)
                if first is None:
                    first = out
                    exact = _fp64_attention(*args[:3], ks, vs, *args[3:])
                    torch.testing.assert_close(out.double().cpu(), exact, rtol=2**-7, atol=2**-6)
                assert_same_bits(out, first)
