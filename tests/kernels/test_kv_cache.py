"""kv_scatter and rope_kv_scatter against their torch references and against plain indexing.

Caches and outputs start poisoned (NaN): slots the kernel must not touch keep their exact
bits, written slots must hold exact copies. Runs under the Triton interpreter on CPU (small
shapes); `gpu` tests add Ouro / Huginn shapes in bf16 and a cache past 2^31 elements.

The Triton 3.9 interpreter truncates fp32 -> bf16 instead of rounding to nearest even
(compiled kernels round correctly), so bf16 results of fp32 math are compared with
`_round_like_backend`, which reproduces the backend's rounding (probed once) of the same fp32
values.
"""

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlt_kernels import kv_cache
from rlt_kernels._triton import tl, triton
from rlt_kernels.norms import apply_rope_reference, rope_cos_sin

from checks import assert_same_bits, randn, seeded

THETA = 10000.0


def _poisoned(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


@triton.jit
def _to_bf16_probe(x_ptr, y_ptr):
    tl.store(y_ptr, tl.load(x_ptr).to(tl.bfloat16))


@functools.lru_cache(maxsize=None)
def _backend_truncates_bf16(device_type):
    x = torch.tensor([1 + 2**-8 + 2**-10], device=device_type)  # nearest-even rounds up, truncation down
    y = torch.empty(1, dtype=torch.bfloat16, device=device_type)
    _to_bf16_probe[(1,)](x, y)
    return y.item() != x.to(torch.bfloat16).item()


def _round_like_backend(x32, dtype):
    """fp32 -> dtype as the kernel backend rounds (the interpreter truncates to bf16)."""
    if dtype == torch.bfloat16 and _backend_truncates_bf16(x32.device.type):
        return (x32.contiguous().view(torch.int32) & -65536).view(torch.float32).to(dtype)
    return x32.to(dtype)


@pytest.mark.gpu
def test_compiled_kernels_round_bf16_to_nearest_even(device):
    assert not _backend_truncates_bf16(device.type)


def _active(count, device):
    return None if count is None else torch.tensor([count], dtype=torch.int32, device=device)


def _slots(num_slots, t, gen, device, negatives=()):
    """Distinct slots for t rows, with the given rows set to -1."""
    slots = torch.randperm(num_slots, generator=_cpu_gen(gen))[:t].to(device)
    for i in negatives:
        slots[i] = -1
    return slots


def _cpu_gen(gen):
    return torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen, device=gen.device)))


def _plain_scatter(cache, rows, slots, live):
    """Expected cache: `cache` with row i copied to its slot for i < live and slot >= 0."""
    expected = cache.clone()
    bs = cache.shape[1]
    for i in range(live):
        s = int(slots[i])
        if s >= 0:
            expected[s // bs, s % bs] = rows[i].to(cache.dtype)
    return expected


def _garbage_past(slots, live, num_slots):
    """Past the active count, replace slots by valid ones that live rows do not use: a kernel
    that read them would write visibly."""
    used = set(int(s) for s in slots[:live])
    free = [s for s in range(num_slots) if s not in used]
    for j, i in enumerate(range(live, slots.shape[0])):
        slots[i] = free[j % len(free)]
    return slots


# --------------------------------------------------------------------------------- kv_scatter


@pytest.mark.parametrize(
    "block_size,head_dim,kv_heads,dtype,cache_dtype",
    [
        (16, 64, 2, torch.bfloat16, torch.bfloat16),
        (128, 96, 3, torch.bfloat16, torch.bfloat16),
        (16, 128, 1, torch.float32, torch.float16),
        (128, 128, 2, torch.bfloat16, torch.float32),
        (16, 96, 5, torch.float32, torch.float32),
    ],
)
@pytest.mark.parametrize("active", [None, 6])
def test_kv_scatter_matches_reference_and_indexing(device, block_size, head_dim, kv_heads, dtype, cache_dtype, active):
    gen = seeded(block_size + head_dim + kv_heads, device)
    t, num_blocks = 11, 3
    k = randn((t, kv_heads, head_dim), dtype, device, gen)
    v = randn((t, kv_heads, head_dim), dtype, device, gen)
    slots = _slots(num_blocks * block_size, t, gen, device, negatives=(1, 4, 9))
    live = t if active is None else active
    slots = _garbage_past(slots, live, num_blocks * block_size)
    k_cache = _poisoned((num_blocks, block_size, kv_heads, head_dim), cache_dtype, device)
    v_cache = _poisoned((num_blocks, block_size, kv_heads, head_dim), cache_dtype, device)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()

    kv_cache.kv_scatter(k, v, k_cache, v_cache, slots, active_rows=_active(active, device))
    kv_cache.kv_scatter_reference(k, v, k_ref, v_ref, slots, active_rows=_active(active, device))
    assert_same_bits(k_cache, k_ref)
    assert_same_bits(v_cache, v_ref)
    assert_same_bits(k_cache, _plain_scatter(_poisoned(k_cache.shape, cache_dtype, device), k, slots, live))
    assert_same_bits(v_cache, _plain_scatter(_poisoned(v_cache.shape, cache_dtype, device), v, slots, live))


@pytest.mark.parametrize("active", [0, 1, 3])
def test_kv_scatter_active_rows_with_garbage_metadata(device, active):
    """Rows at or past the count are inert even when their slots point anywhere in the cache."""
    gen = seeded(active, device)
    t, bs = 5, 16
    k = randn((t, 2, 64), torch.bfloat16, device, gen)
    v = randn((t, 2, 64), torch.bfloat16, device, gen)
    slots = _garbage_past(_slots(2 * bs, t, gen, device), active, 2 * bs)
    k_cache = _poisoned((2, bs, 2, 64), torch.bfloat16, device)
    v_cache = _poisoned((2, bs, 2, 64), torch.bfloat16, device)
    kv_cache.kv_scatter(k, v, k_cache, v_cache, slots, active_rows=_active(active, device))
    written = ~torch.isnan(k_cache).all(-1).all(-1).view(-1)
    assert written.sum().item() == active
    assert set(written.nonzero().view(-1).tolist()) == set(slots[:active].tolist())
    assert torch.equal(torch.isnan(k_cache), torch.isnan(v_cache))


def test_kv_scatter_strided_views(device):
    """k/v as column slices of a fused qkv buffer; caches as one layer of a multi-layer pool."""
    gen = seeded(7, device)
    t, h, kvh, d, bs, layers, blocks = 6, 4, 2, 96, 16, 3, 2
    qkv = randn((t, (h + 2 * kvh) * d), torch.bfloat16, device, gen)
    k = qkv[:, h * d:(h + kvh) * d].view(t, kvh, d)
    v = qkv[:, (h + kvh) * d:].view(t, kvh, d)
    pool_k = _poisoned((layers, blocks, bs, kvh, d), torch.bfloat16, device)
    pool_v = _poisoned((layers, blocks, bs, kvh, d), torch.bfloat16, device)
    slots = _slots(blocks * bs, t, gen, device, negatives=(2,))
    kv_cache.kv_scatter(k, v, pool_k[1], pool_v[1], slots)
    empty = _poisoned((blocks, bs, kvh, d), torch.bfloat16, device)
    for layer in (0, 2):
        assert_same_bits(pool_k[layer], empty)
        assert_same_bits(pool_v[layer], empty)
    assert_same_bits(pool_k[1], _plain_scatter(empty, k, slots, t))
    assert_same_bits(pool_v[1], _plain_scatter(empty, v, slots, t))


def test_kv_scatter_empty_batch(device):
    k = torch.empty((0, 2, 64), device=device)
    cache = _poisoned((1, 16, 2, 64), torch.float32, device)
    kv_cache.kv_scatter(k, k, cache, cache.clone(), torch.empty(0, dtype=torch.int64, device=device))
    assert torch.isnan(cache).all()


def test_kv_scatter_rejects_bad_shapes(device):
    k = torch.zeros((2, 2, 64), device=device)
    cache = torch.zeros((1, 16, 2, 64), device=device)
    slots = torch.zeros(2, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="k_cache"):
        kv_cache.kv_scatter(k, k, torch.zeros((1, 16, 3, 64), device=device), cache, slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        kv_cache.kv_scatter(k, k, cache, cache, slots[:1])
    with pytest.raises(ValueError, match="contiguous"):
        kv_cache.kv_scatter(k, k, cache.transpose(2, 3).contiguous().transpose(2, 3), cache, slots)


@settings(max_examples=25)
@given(
    t=st.integers(0, 12),
    block_size=st.sampled_from([16, 32]),
    negative_every=st.integers(2, 5),
    active=st.one_of(st.none(), st.integers(-1, 14)),
    slot_dtype=st.sampled_from([torch.int64, torch.int32]),
    seed=st.integers(0, 2**16),
)
def test_kv_scatter_property(device, t, block_size, negative_every, active, slot_dtype, seed):
    gen = seeded(seed, device)
    num_slots = 3 * block_size
    k = randn((t, 2, 64), torch.float32, device, gen)
    v = randn((t, 2, 64), torch.float32, device, gen)
    slots = _slots(num_slots, t, gen, device, negatives=range(0, t, negative_every))
    live = t if active is None else max(0, min(active, t))
    slots = _garbage_past(slots, live, num_slots).to(slot_dtype)
    k_cache = _poisoned((3, block_size, 2, 64), torch.float32, device)
    v_cache = _poisoned((3, block_size, 2, 64), torch.float32, device)
    kv_cache.kv_scatter(k, v, k_cache, v_cache, slots, active_rows=_active(active, device))
    assert_same_bits(k_cache, _plain_scatter(_poisoned(k_cache.shape, torch.float32, device), k, slots, live))
    assert_same_bits(v_cache, _plain_scatter(_poisoned(v_cache.shape, torch.float32, device), v, slots, live))


@triton.jit
def _slot_offset_probe(slot_ptr, out_ptr, block_size, stride_block, stride_slot, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, kv_cache.slot_offset(tl.load(slot_ptr + i), block_size, stride_block, stride_slot))


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_slot_offset_is_int64(device, slot_dtype):
    """The kernels' slot -> element offset stays exact far past 2^31 (int32 math would wrap),
    for int64 and int32 slot mappings."""
    block_size, stride_block, stride_slot = 16, 16 * 8 * 128, 8 * 128
    big = 2**33 + 3 if slot_dtype == torch.int64 else 2**31 - 1
    values = [0, 17, 2**31 // stride_slot + 5, 3 * 2**28 + 11, big, 2**30 + 7, 5, 2**31 - 17]
    slots = torch.tensor(values, dtype=slot_dtype, device=device)
    out = torch.empty(8, dtype=torch.int64, device=device)
    _slot_offset_probe[(1,)](slots, out, block_size, stride_block, stride_slot, N=8)
    expected = [(s // block_size) * stride_block + (s % block_size) * stride_slot for s in values]
    assert out.tolist() == expected
    assert max(expected) > 2**40


@pytest.mark.gpu
def test_kv_scatter_cache_past_2_pow_31_elements(device):
    """A bf16 cache of more than 2^31 elements (~4.3 GB each): writes land at its very end."""
    kvh, d, bs = 8, 128, 16
    num_blocks = 2**31 // (bs * kvh * d) + 64
    k_cache = torch.full((num_blocks, bs, kvh, d), float("nan"), dtype=torch.bfloat16, device=device)
    v_cache = torch.full_like(k_cache, float("nan"))
    gen = seeded(1, device)
    k = randn((4, kvh, d), torch.bfloat16, device, gen)
    v = randn((4, kvh, d), torch.bfloat16, device, gen)
    last = num_blocks * bs - 1
    slots = torch.tensor([last, last - 17, -1, 2**31 // (kvh * d) + 3], dtype=torch.int64, device=device)
    kv_cache.kv_scatter(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(-1, kvh, d), v_cache.view(-1, kvh, d)
    for i in (0, 1, 3):
        s = int(slots[i])
        assert_same_bits(flat_k[s], k[i])
        assert_same_bits(flat_v[s], v[i])
    assert (~torch.isnan(flat_k[:, 0, 0])).sum().item() == 3
    assert (~torch.isnan(flat_v[:, 0, 0])).sum().item() == 3


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 64, 4096])
@pytest.mark.parametrize("kvh,d,bs", [(16, 128, 16), (55, 96, 128)])
def test_kv_scatter_model_shapes_bf16(device, t, kvh, d, bs):
    gen = seeded(t + kvh, device)
    num_blocks = 2 * t // bs + 4
    k = randn((t, kvh, d), torch.bfloat16, device, gen)
    v = randn((t, kvh, d), torch.bfloat16, device, gen)
    slots = torch.randperm(num_blocks * bs, device=device)[:t]
    slots[::7] = -1
    active = _active(t - t // 5, device)
    k_cache = _poisoned((num_blocks, bs, kvh, d), torch.bfloat16, device)
    v_cache = _poisoned((num_blocks, bs, kvh, d), torch.bfloat16, device)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    kv_cache.kv_scatter(k, v, k_cache, v_cache, slots, active_rows=active)
    kv_cache.kv_scatter_reference(k, v, k_ref, v_ref, slots, active_rows=active)
    assert_same_bits(k_cache, k_ref)
    assert_same_bits(v_cache, v_ref)


# ----------------------------------------------------------------------------- rope_kv_scatter


def _rope_complex(x, positions, style, bias=None):
    """Independent fp64 rotary embedding: each pair is a complex number times e^{i p theta_j}."""
    x = x.double() + (0 if bias is None else bias.double())
    d = x.shape[-1]
    inv_freq = THETA ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angles = positions.double()[:, None] * inv_freq
    turn = torch.polar(torch.ones_like(angles), angles)[:, None, :]
    if style == "neox":
        z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * turn
        return torch.cat([z.real, z.imag], dim=-1)
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * turn
    return torch.stack([z.real, z.imag], dim=-1).flatten(-2)


def _rope_case(device, seed, t, h, kvh, d, dtype, bias):
    gen = seeded(seed, device)
    q = randn((t, h, d), dtype, device, gen)
    k = randn((t, kvh, d), dtype, device, gen)
    v = randn((t, kvh, d), dtype, device, gen)
    positions = torch.randint(0, 200, (t,), generator=gen, device=device)
    q_bias = randn((h, d), dtype, device, gen) if bias else None
    k_bias = randn((kvh, d), dtype, device, gen) if bias else None
    return q, k, v, positions, q_bias, k_bias


def _expected_rope(q, k, v, positions, cos_sin, style, q_bias, k_bias, k_cache, v_cache, slots, live):
    """(q_rot [live rows], k_cache, v_cache) from the reference's fp32 math and the backend's
    rounding; the caches must have k's and v's dtype."""
    up = lambda x: None if x is None else x.float()  # noqa: E731  (bf16/fp16 -> fp32 is exact)
    q32 = apply_rope_reference(up(q)[:live], positions[:live], cos_sin, style=style, bias=up(q_bias))
    k32 = apply_rope_reference(up(k)[:live], positions[:live], cos_sin, style=style, bias=up(k_bias))
    k_rot = _round_like_backend(k32, k.dtype)
    return (
        _round_like_backend(q32, q.dtype),
        _plain_scatter(k_cache, k_rot, slots, live),
        _plain_scatter(v_cache, v, slots, live),
    )


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "h,kvh,d,bs,dtype",
    [(4, 2, 64, 16, torch.float32), (6, 2, 96, 128, torch.bfloat16), (3, 1, 128, 16, torch.float16)],
)
def test_rope_kv_scatter_matches_reference(device, style, bias, h, kvh, d, bs, dtype):
    t, num_blocks, live = 7, 2, 5
    q, k, v, positions, q_bias, k_bias = _rope_case(device, h * d + bs, t, h, kvh, d, dtype, bias)
    cos_sin = rope_cos_sin(256, d, THETA, device=device)
    slots = _garbage_past(_slots(num_blocks * bs, t, seeded(d, device), device, negatives=(3,)), live, num_blocks * bs)
    k_cache = _poisoned((num_blocks, bs, kvh, d), dtype, device)
    v_cache = _poisoned((num_blocks, bs, kvh, d), dtype, device)
    q_out = _poisoned(q.shape, dtype, device)
    q_exp, k_exp, v_exp = _expected_rope(
        q, k, v, positions, cos_sin, style, q_bias, k_bias, k_cache, v_cache, slots, live
    )
    active = _active(live, device)
    result = kv_cache.rope_kv_scatter(
        q, k, v, positions, cos_sin, k_cache, v_cache, slots,
        style=style, q_bias=q_bias, k_bias=k_bias, q_out=q_out, active_rows=active,
    )
    assert result is q_out
    assert_same_bits(q_out[:live], q_exp)
    assert torch.isnan(q_out[live:]).all(), "rows past the active count were written"
    assert_same_bits(k_cache, k_exp)
    assert_same_bits(v_cache, v_exp)
    if dtype != torch.bfloat16 or not _backend_truncates_bf16(device.type):
        k_ref, v_ref = _poisoned(k_cache.shape, dtype, device), _poisoned(v_cache.shape, dtype, device)
        q_ref = kv_cache.rope_kv_scatter_reference(
            q, k, v, positions, cos_sin, k_ref, v_ref, slots,
            style=style, q_bias=q_bias, k_bias=k_bias, q_out=_poisoned(q.shape, dtype, device), active_rows=active,
        )
        assert_same_bits(q_out, q_ref)
        assert_same_bits(k_cache, k_ref)
    tol = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    q_complex = _rope_complex(q[:live], positions[:live], style, q_bias)
    torch.testing.assert_close(q_out[:live].double(), q_complex, rtol=tol, atol=tol)
    written = slots[:live] >= 0
    cached = k_cache.view(-1, kvh, d)[slots[:live][written]]
    k_complex = _rope_complex(k[:live], positions[:live], style, k_bias)[written]
    torch.testing.assert_close(cached.double(), k_complex, rtol=tol, atol=tol)


@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_rope_kv_scatter_in_place_fused_qkv(device, style):
    """q rotated in place (q_out is q), q/k/v views of one qkv buffer, strided layer-slice caches."""
    t, h, kvh, d, bs = 5, 4, 2, 64, 16
    gen = seeded(11, device)
    qkv = randn((t, (h + 2 * kvh) * d), torch.float32, device, gen)
    q = qkv[:, : h * d].view(t, h, d)
    k = qkv[:, h * d:(h + kvh) * d].view(t, kvh, d)
    v = qkv[:, (h + kvh) * d:].view(t, kvh, d)
    positions = torch.arange(t, device=device, dtype=torch.int32) + 40
    cos_sin = rope_cos_sin(64, d, THETA, device=device)
    pool = _poisoned((2, 2, 2, bs, kvh, d), torch.float32, device)  # [k/v, layers, blocks, bs, KVH, D]
    slots = _slots(2 * bs, t, gen, device, negatives=(0,))
    k_ref, v_ref = _poisoned((2, bs, kvh, d), torch.float32, device), _poisoned((2, bs, kvh, d), torch.float32, device)
    q_ref = kv_cache.rope_kv_scatter_reference(q.clone(), k, v, positions, cos_sin, k_ref, v_ref, slots, style=style)
    out = kv_cache.rope_kv_scatter(q, k, v, positions, cos_sin, pool[0, 1], pool[1, 1], slots, style=style, q_out=q)
    assert out is q
    assert_same_bits(q, q_ref)
    assert_same_bits(pool[0, 1], k_ref)
    assert_same_bits(pool[1, 1], v_ref)
    assert torch.isnan(pool[:, 0]).all()


def test_rope_kv_scatter_huginn_heads(device):
    """55 heads of 96 (several head groups per token, masked head_dim), gptj with bias, MHA."""
    t, h, d, bs = 2, 55, 96, 16
    q, k, v, positions, q_bias, k_bias = _rope_case(device, 55, t, h, h, d, torch.float32, True)
    cos_sin = rope_cos_sin(256, d, THETA, device=device)
    slots = torch.tensor([5, 20], device=device)
    caches = [_poisoned((2, bs, h, d), torch.float32, device) for _ in range(4)]
    q_out = kv_cache.rope_kv_scatter(q, k, v, positions, cos_sin, caches[0], caches[1], slots,
                                     style="gptj", q_bias=q_bias, k_bias=k_bias)
    q_ref = kv_cache.rope_kv_scatter_reference(q, k, v, positions, cos_sin, caches[2], caches[3], slots,
                                               style="gptj", q_bias=q_bias, k_bias=k_bias)
    assert_same_bits(q_out, q_ref)
    assert_same_bits(caches[0], caches[2])
    assert_same_bits(caches[1], caches[3])


@settings(max_examples=20)
@given(
    t=st.integers(0, 6),
    group=st.sampled_from([(2, 2), (4, 1), (6, 3)]),
    style=st.sampled_from(["neox", "gptj"]),
    active=st.one_of(st.none(), st.integers(0, 7)),
    seed=st.integers(0, 2**16),
)
def test_rope_kv_scatter_property(device, t, group, style, active, seed):
    h, kvh = group
    d, bs = 64, 16
    q, k, v, positions, _, _ = _rope_case(device, seed, t, h, kvh, d, torch.float32, False)
    cos_sin = rope_cos_sin(256, d, THETA, device=device)
    live = t if active is None else min(active, t)
    slots = _garbage_past(_slots(2 * bs, t, seeded(seed, device), device, negatives=range(1, t, 3)), live, 2 * bs)
    caches = [_poisoned((2, bs, kvh, d), torch.float32, device) for _ in range(4)]
    q_out = _poisoned(q.shape, torch.float32, device)
    kv_cache.rope_kv_scatter(q, k, v, positions, cos_sin, caches[0], caches[1], slots, style=style,
                             q_out=q_out, active_rows=_active(active, device))
    q_ref = kv_cache.rope_kv_scatter_reference(q, k, v, positions, cos_sin, caches[2], caches[3], slots, style=style,
                                               q_out=_poisoned(q.shape, torch.float32, device),
                                               active_rows=_active(active, device))
    assert_same_bits(q_out, q_ref)
    assert_same_bits(caches[0], caches[2])
    assert_same_bits(caches[1], caches[3])


def test_rope_kv_scatter_rejects_bad_arguments(device):
    q = torch.zeros((2, 4, 64), device=device)
    k = torch.zeros((2, 2, 64), device=device)
    cache = torch.zeros((1, 16, 2, 64), device=device)
    pos = torch.zeros(2, dtype=torch.int64, device=device)
    cos_sin = rope_cos_sin(8, 64, THETA, device=device)
    with pytest.raises(ValueError, match="style"):
        kv_cache.rope_kv_scatter(q, k, k, pos, cos_sin, cache, cache, pos, style="half")
    with pytest.raises(ValueError, match="cos_sin"):
        kv_cache.rope_kv_scatter(q, k, k, pos, cos_sin[:, :32], cache, cache, pos)
    with pytest.raises(ValueError, match="q_bias"):
        kv_cache.rope_kv_scatter(q, k, k, pos, cos_sin, cache, cache, pos, q_bias=torch.zeros((2, 64), device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 64, 4096])
@pytest.mark.parametrize(
    "h,kvh,d,bs,style,bias",
    [(16, 16, 128, 16, "neox", False), (55, 55, 96, 128, "gptj", True), (32, 8, 128, 64, "neox", True)],
)
def test_rope_kv_scatter_model_shapes_bf16_bitwise(device, t, h, kvh, d, bs, style, bias):
    """Compiled kernels round like torch and skip FMA contraction: bit-identical to the reference."""
    q, k, v, positions, q_bias, k_bias = _rope_case(device, t + h, t, h, kvh, d, torch.bfloat16, bias)
    cos_sin = rope_cos_sin(4096, d, THETA, device=device)
    positions = torch.randint(0, 4096, (t,), device=device)
    num_blocks = 2 * t // bs + 4
    slots = torch.randperm(num_blocks * bs, device=device)[:t]
    slots[1::9] = -1
    active = _active(t - t // 7, device)
    caches = [_poisoned((num_blocks, bs, kvh, d), torch.bfloat16, device) for _ in range(4)]
    q_out = _poisoned(q.shape, torch.bfloat16, device)
    kv_cache.rope_kv_scatter(q, k, v, positions, cos_sin, caches[0], caches[1], slots, style=style,
                             q_bias=q_bias, k_bias=k_bias, q_out=q_out, active_rows=active)
    q_ref = kv_cache.rope_kv_scatter_reference(
        q, k, v, positions, cos_sin, caches[2], caches[3], slots, style=style,
        q_bias=q_bias, k_bias=k_bias, q_out=_poisoned(q.shape, torch.bfloat16, device), active_rows=active,
    )
    assert_same_bits(q_out, q_ref)
    assert_same_bits(caches[0], caches[2])
    assert_same_bits(caches[1], caches[3])


@pytest.mark.gpu
def test_rope_kv_scatter_cache_past_2_pow_31_elements(device):
    kvh, d, bs = 8, 128, 16
    num_blocks = 2**31 // (bs * kvh * d) + 64
    k_cache = torch.full((num_blocks, bs, kvh, d), float("nan"), dtype=torch.bfloat16, device=device)
    v_cache = torch.full_like(k_cache, float("nan"))
    q, k, v, positions, _, _ = _rope_case(device, 3, 2, 16, kvh, d, torch.bfloat16, False)
    cos_sin = rope_cos_sin(256, d, THETA, device=device)
    slots = torch.tensor([num_blocks * bs - 1, num_blocks * bs - 30], dtype=torch.int64, device=device)
    q_out = kv_cache.rope_kv_scatter(q, k, v, positions, cos_sin, k_cache, v_cache, slots)
    q_ref = apply_rope_reference(q, positions, cos_sin)
    k_ref = apply_rope_reference(k, positions, cos_sin)
    assert_same_bits(q_out, q_ref)
    flat_k, flat_v = k_cache.view(-1, kvh, d), v_cache.view(-1, kvh, d)
    for i in range(2):
        assert_same_bits(flat_k[int(slots[i])], k_ref[i])
        assert_same_bits(flat_v[int(slots[i])], v[i])
    assert (~torch.isnan(flat_k[:, 0, 0])).sum().item() == 2
